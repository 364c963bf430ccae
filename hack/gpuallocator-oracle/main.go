// Command gpuallocator-oracle answers device-plugin allocation requests with NVIDIA's own
// go-gpuallocator best-effort policy, for gangslice's conformance test.
//
// It reads one JSON document on stdin:
//
//	{"topologies": {"<name>": {"gpus": [0, 1, ...],
//	                            "pairs": [{"a": 0, "b": 1, "pcie": "PIX", "nvlinks": 2}, ...]}},
//	 "requests": [{"topology": "<name>", "available": [3, 1, 2], "required": [], "size": 2}, ...]}
//
// and writes one JSON line per request: {"gpus": [...], "padding": N}, where "gpus" are the
// indices of the devices the policy returned, in its order, and "padding" counts the empty
// padding slots among them. Devices are built as go-gpuallocator's NewDevices builds them
// from NVML (one PCIe link, then one NVLink entry when there are NVLinks, for every ordered
// pair), without NVML: the pair descriptions stand in for nvmlDeviceGetTopologyCommonAncestor
// and the NVLink remote-PCI scan.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
)

type pair struct {
	A       int    `json:"a"`
	B       int    `json:"b"`
	PCIe    string `json:"pcie"`
	NVLinks int    `json:"nvlinks"`
}

type topology struct {
	GPUs  []int  `json:"gpus"`
	Pairs []pair `json:"pairs"`
}

type request struct {
	Topology  string `json:"topology"`
	Available []int  `json:"available"`
	Required  []int  `json:"required"`
	Size      int    `json:"size"`
}

type input struct {
	Topologies map[string]topology `json:"topologies"`
	Requests   []request           `json:"requests"`
}

type answer struct {
	GPUs    []int `json:"gpus"`
	Padding int   `json:"padding"`
}

// The PCIe level names nvidia-smi prints, and the go-gpuallocator link each one is
// (internal/links GetP2PLink; BOARD is NVML's TOPOLOGY_INTERNAL).
var pcieLinkNames = map[string]string{
	"SYS":   "P2PLinkCrossCPU",
	"NODE":  "P2PLinkSameCPU",
	"PHB":   "P2PLinkHostBridge",
	"PXB":   "P2PLinkMultiSwitch",
	"PIX":   "P2PLinkSingleSwitch",
	"BOARD": "P2PLinkSameBoard",
}

// linkTypes reads the link types off go-gpuallocator itself: the P2PLinkType type is in an
// internal package, so its values are found through their String() names.
func linkTypes() (map[string]uint64, []uint64) {
	byName := map[string]uint64{}
	var nvlinks []uint64 // nvlinks[k-1] is the type of k bonded NVLinks
	var probe gpuallocator.P2PLink
	field := reflect.ValueOf(&probe).Elem().FieldByName("Type")
	for v := uint64(0); v < 64; v++ {
		field.SetUint(v)
		name := fmt.Sprint(probe.Type)
		if strings.HasPrefix(name, "UNKNOWN") {
			continue
		}
		byName[name] = v
		if strings.HasSuffix(name, "NVLINKLink") || strings.HasSuffix(name, "NVLINKLinks") {
			nvlinks = append(nvlinks, v)
		}
	}
	return byName, nvlinks
}

func link(peer *gpuallocator.Device, kind uint64) gpuallocator.P2PLink {
	l := gpuallocator.P2PLink{GPU: peer}
	reflect.ValueOf(&l).Elem().FieldByName("Type").SetUint(kind)
	return l
}

func build(t topology, byName map[string]uint64, nvlinkTypes []uint64) (map[int]*gpuallocator.Device, error) {
	devices := map[int]*gpuallocator.Device{}
	for _, i := range t.GPUs {
		d := &gpuallocator.Device{Index: i, Links: map[int][]gpuallocator.P2PLink{}}
		d.UUID = fmt.Sprintf("GPU-oracle-%d", i)
		devices[i] = d
	}
	for _, p := range t.Pairs {
		a, b := devices[p.A], devices[p.B]
		if a == nil || b == nil || p.A == p.B {
			return nil, fmt.Errorf("pair %d-%d names an unknown GPU", p.A, p.B)
		}
		name, ok := pcieLinkNames[p.PCIe]
		if !ok {
			return nil, fmt.Errorf("pair %d-%d: unknown PCIe level %q", p.A, p.B, p.PCIe)
		}
		kinds := []uint64{byName[name]}
		if p.NVLinks > 0 {
			if p.NVLinks > len(nvlinkTypes) {
				return nil, fmt.Errorf("pair %d-%d: %d NVLinks, go-gpuallocator knows at most %d", p.A, p.B, p.NVLinks, len(nvlinkTypes))
			}
			kinds = append(kinds, nvlinkTypes[p.NVLinks-1])
		}
		for _, k := range kinds {
			a.Links[b.Index] = append(a.Links[b.Index], link(b, k))
			b.Links[a.Index] = append(b.Links[a.Index], link(a, k))
		}
	}
	return devices, nil
}

func pick(devices map[int]*gpuallocator.Device, indices []int) ([]*gpuallocator.Device, error) {
	out := []*gpuallocator.Device{}
	for _, i := range indices {
		d := devices[i]
		if d == nil {
			return nil, fmt.Errorf("unknown GPU %d", i)
		}
		out = append(out, d)
	}
	return out, nil
}

func run() error {
	var in input
	dec := json.NewDecoder(bufio.NewReader(os.Stdin))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return fmt.Errorf("reading the request document: %w", err)
	}
	byName, nvlinkTypes := linkTypes()
	for _, name := range pcieLinkNames {
		if _, ok := byName[name]; !ok {
			return fmt.Errorf("go-gpuallocator has no link type named %s", name)
		}
	}
	graphs := map[string]map[int]*gpuallocator.Device{}
	for name, t := range in.Topologies {
		devices, err := build(t, byName, nvlinkTypes)
		if err != nil {
			return fmt.Errorf("topology %s: %w", name, err)
		}
		graphs[name] = devices
	}
	policy := gpuallocator.NewBestEffortPolicy()
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for n, r := range in.Requests {
		devices, ok := graphs[r.Topology]
		if !ok {
			return fmt.Errorf("request %d: unknown topology %q", n, r.Topology)
		}
		available, err := pick(devices, r.Available)
		if err != nil {
			return fmt.Errorf("request %d available: %w", n, err)
		}
		required, err := pick(devices, r.Required)
		if err != nil {
			return fmt.Errorf("request %d required: %w", n, err)
		}
		got := answer{GPUs: []int{}}
		for _, d := range policy.Allocate(available, required, r.Size) {
			if d == nil {
				got.Padding++
				continue
			}
			got.GPUs = append(got.GPUs, d.Index)
		}
		if err := enc.Encode(got); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "gpuallocator-oracle: %v\n", err)
		os.Exit(1)
	}
}
