#!/usr/bin/env python3
"""Print the SPDX 2.3 (JSON) bill of materials of an image root filesystem: every Debian
package unpacked into it (the list hack/image/rootfs.sh records at extraction) and every Python
distribution installed in it (their .dist-info), each with its package URL.

Usage: sbom.py ROOTFS IMAGE_REF VERSION ARCH > image.spdx.json
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import sys
from email.parser import HeaderParser
from pathlib import Path
from urllib.parse import quote

SITE = "usr/local/lib/python3.11/dist-packages"
DEBIAN_LIST = "usr/share/gangslice/debian-packages.tsv"


def spdx_id(kind: str, name: str) -> str:
    return f"SPDXRef-{kind}-" + re.sub(r"[^A-Za-z0-9.-]", "-", name)


def package(kind: str, name: str, version: str, purl: str, supplier: str) -> dict[str, object]:
    return {
        "name": name,
        "SPDXID": spdx_id(kind, f"{name}-{version}"),
        "versionInfo": version,
        "supplier": supplier,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "externalRefs": [
            {"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}
        ],
    }


def main() -> int:
    rootfs, ref, version, arch = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    packages = []
    for line in (rootfs / DEBIAN_LIST).read_text().splitlines():
        name, deb_version, deb_arch = line.split("\t")
        purl = f"pkg:deb/debian/{name}@{quote(deb_version)}?arch={deb_arch}&distro=debian-12"
        packages.append(package("deb", name, deb_version, purl, "Organization: Debian"))
    for meta in sorted((rootfs / SITE).glob("*.dist-info/METADATA")):
        headers = HeaderParser().parsestr(meta.read_text(errors="replace"))
        name, py_version = headers["Name"], headers["Version"]
        purl = f"pkg:pypi/{name.lower().replace('_', '-')}@{py_version}"
        packages.append(package("pypi", name, py_version, purl, "NOASSERTION"))
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    created = datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    digest = hashlib.sha256(json.dumps(packages, sort_keys=True).encode()).hexdigest()[:16]
    purl = f"pkg:oci/gangslice@{version}?arch={arch}&repository_url={quote(ref.rsplit(':', 1)[0])}"
    image = {
        "name": ref,
        "SPDXID": "SPDXRef-image",
        "versionInfo": version,
        "supplier": "NOASSERTION",
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "Apache-2.0",
        "copyrightText": "NOASSERTION",
        "primaryPackagePurpose": "CONTAINER",
        "externalRefs": [
            {
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": purl,
            }
        ],
    }
    doc = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{ref} ({arch})",
        "documentNamespace": f"https://spdx.org/spdxdocs/gangslice-{version}-{arch}-{digest}",
        "creationInfo": {"created": created, "creators": ["Tool: gangslice hack/image/sbom.py"]},
        "documentDescribes": ["SPDXRef-image"],
        "packages": [image, *packages],
        "relationships": [
            {
                "spdxElementId": "SPDXRef-image",
                "relationshipType": "CONTAINS",
                "relatedSpdxElement": p["SPDXID"],
            }
            for p in packages
        ],
    }
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
