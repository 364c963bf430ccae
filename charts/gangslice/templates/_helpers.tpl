{{/* Written by hack/gen-chart.py; do not edit. */}}
{{/*
gangslice.overlay (list BASE VALUE): BASE, the manifests' map, with each key of VALUE, the
user's, set over it, as YAML; a key whose value is null drops BASE's key. Sprig's merge and
mergeOverwrite cannot set false or 0 over true or 1, hence the loop.
*/}}
{{- define "gangslice.overlay" -}}
{{- $out := index . 0 -}}
{{- range $key, $value := index . 1 -}}
{{- if kindIs "invalid" $value -}}
{{- $_ := unset $out $key -}}
{{- else -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
