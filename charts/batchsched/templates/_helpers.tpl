{{/*
The objects of one of deploy/'s files (files/NAME links to it), as a JSON
list: each YAML document that has a kind. Templates change only what the
values say; everything else is deploy/'s, so the chart and `kubectl apply -k
deploy/` stay one set of objects (tests/integration/test_helm_chart.py).
*/}}
{{- define "batchsched.objects" -}}
{{- $objects := list -}}
{{- range $raw := regexSplit "(?m)^---[ \t]*$" (.root.Files.Get .file) -1 -}}
{{- $object := fromYaml $raw -}}
{{- if and $object (hasKey $object "kind") -}}
{{- $objects = append $objects $object -}}
{{- end -}}
{{- end -}}
{{- toJson $objects -}}
{{- end -}}

{{- define "batchsched.clusterScoped" -}}
{{- list "Namespace" "ClusterRole" "ClusterRoleBinding" "PriorityClass" "CustomResourceDefinition" "ValidatingAdmissionPolicy" "ValidatingAdmissionPolicyBinding" "MutatingAdmissionPolicy" "MutatingAdmissionPolicyBinding" | toJson -}}
{{- end -}}

{{/*
One object as deploy/ applies it, in namespace .namespace ("": it keeps its
own, as the node agent's do): the labels kustomize adds and Helm's, and
ServiceAccount subjects of bindings in that namespace.
*/}}
{{- define "batchsched.emit" -}}
{{- $object := .object -}}
{{- $metadata := $object.metadata -}}
{{- $labels := merge (dict "app.kubernetes.io/name" "batchsched" "app.kubernetes.io/part-of" "batchsched"
      "app.kubernetes.io/managed-by" .root.Release.Service "app.kubernetes.io/instance" .root.Release.Name
      "helm.sh/chart" (printf "%s-%s" .root.Chart.Name .root.Chart.Version)) ($metadata.labels | default dict) -}}
{{- $_ := set $metadata "labels" $labels -}}
{{- if .namespace -}}
{{- if not (has $object.kind (include "batchsched.clusterScoped" . | fromJsonArray)) -}}
{{- $_ := set $metadata "namespace" .namespace -}}
{{- end -}}
{{- range $subject := $object.subjects | default list -}}
{{- if eq $subject.kind "ServiceAccount" -}}
{{- $_ := set $subject "namespace" $.namespace -}}
{{- end -}}
{{- end -}}
{{- end }}
---
{{ toYaml $object }}
{{- end -}}

{{- define "batchsched.image" -}}
{{- printf "%s:%s" .repository (toString .tag) -}}
{{- end -}}

{{/* The scheduler's config: deploy/scheduler.yaml with .Values.config over it. */}}
{{- define "batchsched.config" -}}
{{- toYaml (mergeOverwrite (fromYaml (.Files.Get "files/scheduler.yaml")) (deepCopy .Values.config)) -}}
{{- end -}}
