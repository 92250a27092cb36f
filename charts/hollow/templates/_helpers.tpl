{{- define "hollow.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hollow.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "hollow.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "hollow.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- /* Whether the fleet's nodes use one identity (the service account's or the target kubeconfig's). */ -}}
{{- define "hollow.sharedCredentials" -}}
{{- if eq .Values.fleet.nodeCredentials "shared" }}true{{ end -}}
{{- end -}}

{{- /* Whether the fleet registers into the cluster it runs in. */ -}}
{{- define "hollow.inCluster" -}}
{{- if eq .Values.target.mode "in-cluster" }}true{{ end -}}
{{- end -}}

{{- /* Checks that no schema can express (values that depend on each other). */ -}}
{{- define "hollow.validate" -}}
{{- if and (ne .Values.fleet.nodeCredentials "shared") (eq .Values.fleet.watchMode "shared") }}
{{- fail (printf "fleet.nodeCredentials %s needs fleet.watchMode per-node (a node identity may not watch every pod)" .Values.fleet.nodeCredentials) }}
{{- end }}
{{- if and (eq .Values.target.mode "external") (not .Values.target.kubeconfigSecret) }}
{{- fail "target.kubeconfigSecret is required with target.mode external (a Secret holding the target cluster's kubeconfig)" }}
{{- end }}
{{- if and (eq .Values.fleet.nodeCredentials "per-node") (not .Values.fleet.nodeCaSecret) }}
{{- fail "fleet.nodeCaSecret is required with fleet.nodeCredentials per-node" }}
{{- end }}
{{- if and (eq .Values.fleet.nodeCredentials "bootstrap") (not .Values.fleet.bootstrapKubeconfigSecret) }}
{{- fail "fleet.bootstrapKubeconfigSecret is required with fleet.nodeCredentials bootstrap" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled .Values.hostNetwork }}
{{- fail "serviceMonitor needs hostNetwork false: on a host network every fleet process serves metrics on its own port (metricsPort + ordinal), which one Service port cannot name" }}
{{- end }}
{{- end -}}

{{- /*
Resources: .Values.resources when given, else sized from fleet.nodesPerProcess, with room for bursts over the
measured release figures (~15 KiB per idle hollow node, 3.5–4.4 KiB per running pod, ~17 MiB per process,
0.8–1.1 ms CPU per idle node-minute; start-up and pod bursts cost more CPU and up to ~2× the RSS).
*/ -}}
{{- define "hollow.resources" -}}
{{- if .Values.resources }}
{{- toYaml .Values.resources }}
{{- else }}
{{- $n := int .Values.fleet.nodesPerProcess }}
requests:
  cpu: {{ add 100 (div $n 10) }}m
  memory: {{ add 64 (div (mul $n 256) 1024) }}Mi
limits:
  memory: {{ add 128 $n }}Mi
{{- end }}
{{- end -}}

{{- /*
Affinity: the user's, plus a required node affinity that keeps fleet pods off hollow nodes (every hollow node
carries the hollow.node-agent.io/profile label) and, unless the user gives pod anti-affinity, a preference to
spread the fleet's pods over machines.
*/ -}}
{{- define "hollow.affinity" -}}
{{- $aff := deepCopy (default (dict) .Values.affinity) }}
{{- $notHollow := dict "key" "hollow.node-agent.io/profile" "operator" "DoesNotExist" }}
{{- $nodeAff := default (dict) $aff.nodeAffinity }}
{{- $required := default (dict) (get $nodeAff "requiredDuringSchedulingIgnoredDuringExecution") }}
{{- $terms := list }}
{{- range (default (list (dict)) $required.nodeSelectorTerms) }}
{{- $term := deepCopy . }}
{{- $_ := set $term "matchExpressions" (append (default (list) $term.matchExpressions) $notHollow) }}
{{- $terms = append $terms $term }}
{{- end }}
{{- $_ := set $required "nodeSelectorTerms" $terms }}
{{- $_ := set $nodeAff "requiredDuringSchedulingIgnoredDuringExecution" $required }}
{{- $_ := set $aff "nodeAffinity" $nodeAff }}
{{- if not $aff.podAntiAffinity }}
{{- $selector := dict "matchLabels" (include "hollow.selector" . | fromYaml) }}
{{- $spread := dict "weight" 100 "podAffinityTerm" (dict "topologyKey" "kubernetes.io/hostname" "labelSelector" $selector) }}
{{- $_ := set $aff "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list $spread)) }}
{{- end }}
{{- toYaml $aff }}
{{- end -}}

{{- /* The pod-level settings the fleet and its pre-delete hook share: placement and network. */ -}}
{{- define "hollow.placement" -}}
{{- if .Values.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  # the service account token and mounted Secrets readable by the non-root user
  fsGroup: 65532
  seccompProfile: {type: RuntimeDefault}
{{- with .Values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
affinity: {{- include "hollow.affinity" . | nindent 2 }}
{{- end -}}

{{- define "hollow.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}
