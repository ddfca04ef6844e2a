{{/* The release's objects' name, as Helm's own chart scaffold makes it:
fullnameOverride, else the release name if it contains the chart's name
(nameOverride, default trustbridge), else <release>-<name>; at most 63
characters, a DNS label. helm install trustbridge ... names everything
trustbridge, as deploy/base. */}}
{{- define "trustbridge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The full name with a suffix (list . "bundle"): the full name is cut
so that the whole stays within 63 characters, a Service's and a label
value's limit. */}}
{{- define "trustbridge.suffixed" -}}
{{- $root := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- $base := include "trustbridge.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end }}

{{/* Labels of every object: app.kubernetes.io/name is the full name (the
base's trustbridge), so that two releases in one namespace never select
each other's pods; plus Helm's. */}}
{{- define "trustbridge.labels" -}}
app.kubernetes.io/name: {{ include "trustbridge.fullname" . }}
{{ include "trustbridge.helmLabels" . }}
{{- end }}

{{- define "trustbridge.helmLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The selector: for release trustbridge the base's, unchanged, so that
the chart can take over a kustomize installation's Deployment (selectors are
immutable; a release of another name keeps it with fullnameOverride). */}}
{{- define "trustbridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trustbridge.fullname" . }}
{{- end }}

{{- define "trustbridge.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* Server defaults the RBAC rules name; an empty value means the default. */}}
{{- define "trustbridge.caSecret" -}}
{{ .Values.storage.caSecret | default "trustbridge-ca" }}
{{- end }}
{{- define "trustbridge.rootConfigMap" -}}
{{ .Values.distribution.rootConfigMap | default "trustbridge-ca-root-cert" }}
{{- end }}

{{/* The node agent's names and labels: its own app.kubernetes.io/name, so
that the server's selectors never pick its pods. */}}
{{- define "trustbridge.agentName" -}}
{{ include "trustbridge.suffixed" (list . "agent") }}
{{- end }}
{{- define "trustbridge.agentAccount" -}}
{{ .Values.agent.namespace.name }}/{{ include "trustbridge.agentName" . }}
{{- end }}
{{- define "trustbridge.agentLabels" -}}
app.kubernetes.io/name: {{ include "trustbridge.agentName" . }}
{{ include "trustbridge.helmLabels" . }}
{{- end }}
{{- define "trustbridge.csiDriverName" -}}
{{ include "trustbridge.suffixed" (list . "csi-driver") }}
{{- end }}
{{- define "trustbridge.csiDriverLabels" -}}
app.kubernetes.io/name: {{ include "trustbridge.csiDriverName" . }}
{{ include "trustbridge.helmLabels" . }}
{{- end }}

{{/* "true" when the server lets node proxies ask for their pods'
certificates (ca-trusted-node-accounts not empty, and the schema refuses
blank entries; null is the default list): only then does it watch pods. */}}
{{- define "trustbridge.impersonation" -}}
{{- $a := .Values.policy.caTrustedNodeAccounts -}}
{{- if or (kindIs "invalid" $a) $a -}}true{{- end -}}
{{- end }}

{{/* Combinations the server refuses at start, refused at render time with
the value to change. values.schema.json checks each value alone. */}}
{{- define "trustbridge.validate" -}}
{{- if not .Values.trustDomain -}}
{{- fail "trustDomain is required: the trust domain this server is the CA of, e.g. --set trustDomain=example.org" -}}
{{- end -}}
{{- if eq .Values.storage.type "file" -}}
{{- if gt (int .Values.replicas) 1 -}}
{{- fail (printf "replicas is %d but storage.type=file holds the CA state in one replica's volume: set replicas=1, or storage.type=kube to run several" (int .Values.replicas)) -}}
{{- end -}}
{{- if .Values.federation.crd -}}
{{- fail "federation.crd needs storage.type=kube (the server's --federation-crd): set federation.crd=false and list peers in federation.peers, or use kube storage" -}}
{{- end -}}
{{- if .Values.trustPolicy.crd -}}
{{- fail "trustPolicy.crd needs storage.type=kube (the server's --trust-policy-crd): set trustPolicy.crd=false and write the rules in extraConfig's trustPolicy key or a --trust-policy file, or use kube storage" -}}
{{- end -}}
{{- if .Values.identityMap.crd -}}
{{- fail "identityMap.crd needs storage.type=kube (the server's --identity-map-crd): set identityMap.crd=false and write the rules in an --identity-map file, or use kube storage" -}}
{{- end -}}
{{- if .Values.storage.caSecret -}}
{{- fail "storage.caSecret names the CA Secret of kube storage; with storage.type=file leave it empty" -}}
{{- end -}}
{{- end -}}
{{- with .Values.upstream.kubeCSR -}}
{{- if .enabled -}}
{{- if not .signerName -}}
{{- fail "upstream.kubeCSR.enabled needs upstream.kubeCSR.signerName: the signerName of a signer that issues CA certificates, e.g. example.com/trustbridge-intermediate" -}}
{{- end -}}
{{- $domain := index (splitList "/" .signerName) 0 -}}
{{- if or (eq $domain "kubernetes.io") (hasSuffix ".kubernetes.io" $domain) -}}
{{- fail (printf "upstream.kubeCSR.signerName %s: the built-in kubernetes.io signers never issue CA certificates; name a signer that does (for example cert-manager's)" .signerName) -}}
{{- end -}}
{{- if not (contains "-----BEGIN CERTIFICATE-----" .roots) -}}
{{- fail "upstream.kubeCSR.enabled needs upstream.kubeCSR.roots: the signer's root certificates, PEM (the CSR API does not return them)" -}}
{{- end -}}
{{- else if or .signerName .roots .csrTimeout .ttl -}}
{{- fail "upstream.kubeCSR values are set but upstream.kubeCSR.enabled is false: set enabled=true to use the Kubernetes CSR API upstream" -}}
{{- end -}}
{{- end -}}
{{- include "trustbridge.validatePodIdentity" . -}}
{{- if eq (toString (index .Values.extraConfig "upstream")) "kube-csr" -}}
{{- fail "extraConfig.upstream=kube-csr: set upstream.kubeCSR.enabled=true instead, which also grants the RBAC rule it needs and mounts the signer's roots" -}}
{{- end -}}
{{- if .Values.agent.enabled -}}
{{- if ne .Values.storage.type "kube" -}}
{{- fail "agent.enabled needs storage.type=kube: the agent reads the server's roots from the ConfigMap kube storage distributes to every namespace" -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.policy.caTrustedNodeAccounts) -}}
{{- if not (has (include "trustbridge.agentAccount" .) .Values.policy.caTrustedNodeAccounts) -}}
{{- fail (printf "agent.enabled but policy.caTrustedNodeAccounts does not list %s, the agent's service account: the server would refuse it every workload's certificate; add it, or leave the value null" (include "trustbridge.agentAccount" .)) -}}
{{- end -}}
{{- end -}}
{{- with .Values.agent.broker -}}
{{- if and .enabled (not .allow) -}}
{{- fail "agent.broker.enabled needs agent.broker.allow: name each broker, e.g. [sa:istio-system/ztunnel] (docs/brokers.md)" -}}
{{- end -}}
{{- $b := printf "%s/" (clean .socketDir) -}}
{{- $s := printf "%s/" (clean $.Values.agent.socketDir) -}}
{{- if and .enabled (or (hasPrefix $s $b) (hasPrefix $b $s)) -}}
{{- fail "agent.broker.socketDir must be neither agent.socketDir nor inside or above it: every pod may mount that directory, only brokers should reach the broker socket" -}}
{{- end -}}
{{- end -}}
{{- else if .Values.agent.csiDriver.enabled -}}
{{- fail "agent.csiDriver.enabled needs agent.enabled: the CSI driver mounts the node agent's socket" -}}
{{- else if .Values.agent.broker.enabled -}}
{{- fail "agent.broker.enabled needs agent.enabled: brokers are served by the node agent" -}}
{{- end -}}
{{- $reserved := list "trust-domain" "data-dir" "admin-listen" "bundle-listen" "grpc-listen" "grpc-dns-names" "storage" "init" "namespace" "ca-secret" "root-configmap" "root-secret" "root-truststore-password-file" "leader-lease" "bootstrap-token-secret" "federation" "federation-crd" "federation-crd-class" "trust-policy-crd" "identity-map-crd" "identity-map" "identity-map-default" "audit-log" "log-format" "log-level" "admin-allowed-hosts" "config" "kubeconfig" "upstream-kube-roots" "pod-certificate-signer" "pod-certificate-namespaces" "cluster-trust-bundle-signer" -}}
{{- range $k, $v := .Values.extraConfig -}}
{{- if has $k $reserved -}}
{{- fail (printf "extraConfig.%s is set by the chart (a value of its own, or a name RBAC or the pod spec is written for); set the chart's value instead" $k) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The server's config file. Keys are its flag names; a value left empty
leaves the server's default, so that the defaults render deploy/base's
config.yaml exactly. */}}
{{- define "trustbridge.config" -}}
{{- $v := .Values -}}
{{- $c := dict "trust-domain" $v.trustDomain "data-dir" "/var/lib/trustbridge/data" "admin-listen" "0.0.0.0:15014" "bundle-listen" "0.0.0.0:8443" "grpc-listen" "0.0.0.0:15012" "storage" $v.storage.type "audit-log" $v.auditLog "log-format" $v.logFormat -}}
{{- $_ := set $c "grpc-dns-names" (concat (list (printf "%s.%s.svc" (include "trustbridge.fullname" .) .Release.Namespace)) $v.grpcDNSNames) -}}
{{- if eq $v.storage.type "file" -}}
{{- /* Creates the CA on the first start; harmless once it exists. */ -}}
{{- $_ := set $c "init" true -}}
{{- end -}}
{{- if $v.federation.crd -}}{{- $_ := set $c "federation-crd" true -}}{{- end -}}
{{- if $v.trustPolicy.crd -}}{{- $_ := set $c "trust-policy-crd" true -}}{{- end -}}
{{- if $v.identityMap.crd -}}{{- $_ := set $c "identity-map-crd" true -}}{{- end -}}
{{- if and $v.agent.enabled $v.agent.identityMap -}}
{{- $_ := set $c "identity-map" "/etc/trustbridge/identity-map.yaml" -}}
{{- with $v.agent.identityDefault -}}{{- $_ := set $c "identity-map-default" . -}}{{- end -}}
{{- end -}}
{{- $strings := dict "ca-secret" $v.storage.caSecret "root-configmap" $v.distribution.rootConfigMap "namespace-selector" $v.distribution.namespaceSelector "federation-crd-class" $v.federation.crdClass "federation-min-refresh" $v.federation.minRefresh "federation-max-refresh" $v.federation.maxRefresh "federation-timeout" $v.federation.timeout "workload-ttl" $v.policy.workloadTTL "max-workload-ttl" $v.policy.maxWorkloadTTL "max-renewal-lifetime" $v.policy.maxRenewalLifetime "ca-response-roots" $v.policy.caResponseRoots "token-audience" $v.policy.tokenAudience "cluster-id" $v.policy.clusterID "log-level" $v.logLevel -}}
{{- range $k, $s := $strings -}}
{{- if $s -}}{{- $_ := set $c $k $s -}}{{- end -}}
{{- end -}}
{{- $nodeAccounts := $v.policy.caTrustedNodeAccounts -}}
{{- if kindIs "invalid" $nodeAccounts -}}
{{- $nodeAccounts = list "istio-system/ztunnel" (include "trustbridge.agentAccount" .) -}}
{{- end -}}
{{- $_ := set $c "ca-trusted-node-accounts" $nodeAccounts -}}
{{- $optional := dict "federation-allow-private" $v.federation.allowPrivate "federation-allow-empty" $v.federation.allowEmpty "sds-workload-certs" $v.policy.sdsWorkloadCerts "serve-federated" $v.policy.serveFederated "sign-rate-limit" $v.policy.signRateLimit -}}
{{- range $k, $o := $optional -}}
{{- if not (kindIs "invalid" $o) -}}{{- $_ := set $c $k $o -}}{{- end -}}
{{- end -}}
{{- if $v.adminAllowedHosts -}}{{- $_ := set $c "admin-allowed-hosts" $v.adminAllowedHosts -}}{{- end -}}
{{- if $v.federation.peers -}}{{- $_ := set $c "federation" $v.federation.peers -}}{{- end -}}
{{- include "trustbridge.distributionConfig" (list . $c) -}}
{{- if $v.upstream.kubeCSR.enabled -}}
{{- $_ := set $c "upstream" "kube-csr" -}}
{{- $_ := set $c "upstream-signer-name" $v.upstream.kubeCSR.signerName -}}
{{- $_ := set $c "upstream-kube-roots" "/etc/trustbridge/upstream-roots.pem" -}}
{{- if $v.upstream.kubeCSR.csrTimeout -}}{{- $_ := set $c "upstream-csr-timeout" $v.upstream.kubeCSR.csrTimeout -}}{{- end -}}
{{- if $v.upstream.kubeCSR.ttl -}}{{- $_ := set $c "upstream-ttl" $v.upstream.kubeCSR.ttl -}}{{- end -}}
{{- end -}}
{{- with $v.podIdentity -}}
{{- if .podCertificates.enabled -}}
{{- $_ := set $c "pod-certificate-signer" .signerName -}}
{{- $_ := set $c "pod-certificate-namespaces" .podCertificates.namespaces -}}
{{- end -}}
{{- if .clusterTrustBundles.enabled -}}{{- $_ := set $c "cluster-trust-bundle-signer" .signerName -}}{{- end -}}
{{- end -}}
{{- range $k, $x := $v.extraConfig -}}
{{- if hasKey $c $k -}}
{{- fail (printf "extraConfig.%s is already set by a chart value; set it in one place" $k) -}}
{{- end -}}
{{- $_ := set $c $k $x -}}
{{- end -}}
{{- toYaml $c -}}
{{- end }}

{{/* The distribution flags beyond root-configmap and namespace-selector,
set into the config dict (second argument). */}}
{{- define "trustbridge.distributionConfig" -}}
{{- $d := (index . 0).Values.distribution -}}
{{- $c := index . 1 -}}
{{- with $d.rootSecret -}}{{- $_ := set $c "root-secret" . -}}{{- end -}}
{{- if $d.truststore.enabled -}}
{{- $_ := set $c "root-truststore" true -}}
{{- if $d.truststore.passwordSecret.name -}}{{- $_ := set $c "root-truststore-password-file" (printf "/etc/trustbridge/truststore-password/%s" $d.truststore.passwordSecret.key) -}}{{- end -}}
{{- with $d.truststore.profile -}}{{- $_ := set $c "root-truststore-profile" . -}}{{- end -}}
{{- end -}}
{{- $labels := list -}}
{{- range $k, $v := $d.labels -}}{{- $labels = append $labels (printf "%s=%s" $k $v) -}}{{- end -}}
{{- if $labels -}}{{- $_ := set $c "distribution-label" $labels -}}{{- end -}}
{{- $annotations := list -}}
{{- range $k, $v := $d.annotations -}}{{- $annotations = append $annotations (printf "%s=%s" $k $v) -}}{{- end -}}
{{- if $annotations -}}{{- $_ := set $c "distribution-annotation" $annotations -}}{{- end -}}
{{- end }}

{{/* podIdentity: what --pod-certificate-signer and
--cluster-trust-bundle-signer refuse at start, and values set for a
feature that is off. */}}
{{- define "trustbridge.validatePodIdentity" -}}
{{- with .Values.podIdentity -}}
{{- $pc := .podCertificates.enabled -}}
{{- $ctb := .clusterTrustBundles.enabled -}}
{{- if and (or $pc $ctb) (ne $.Values.storage.type "kube") -}}
{{- fail "podIdentity needs storage.type=kube: the leader signs the PodCertificateRequests and writes the ClusterTrustBundles through the API server; set podIdentity.podCertificates.enabled and podIdentity.clusterTrustBundles.enabled to false, or use kube storage" -}}
{{- end -}}
{{- if and (or $pc $ctb) (not .signerName) -}}
{{- fail "podIdentity needs podIdentity.signerName with podCertificates or clusterTrustBundles enabled: the signer name pods ask for (DOMAIN/PATH), e.g. --set podIdentity.signerName=trustbridge.io/svid" -}}
{{- end -}}
{{- if hasPrefix "kubernetes.io/" .signerName -}}
{{- fail (printf "podIdentity.signerName %s: signer names under kubernetes.io/ are Kubernetes' own; use a domain of yours, e.g. trustbridge.io/svid" .signerName) -}}
{{- end -}}
{{- if and $pc (not (trim .podCertificates.namespaces)) -}}
{{- fail "podIdentity.podCertificates.enabled needs podIdentity.podCertificates.namespaces: a label selector of the namespaces whose pods get certificates, e.g. trustbridge.io/pod-certificates=enabled; every namespace: kubernetes.io/metadata.name" -}}
{{- end -}}
{{- if and .podCertificates.namespaces (not $pc) -}}
{{- fail "podIdentity.podCertificates.namespaces is set but podIdentity.podCertificates.enabled is false: set enabled=true to sign pod certificates, or leave namespaces empty" -}}
{{- end -}}
{{- if and .signerName (not (or $pc $ctb)) -}}
{{- fail "podIdentity.signerName is set but neither podIdentity.podCertificates.enabled nor podIdentity.clusterTrustBundles.enabled is: enable one, or leave signerName empty" -}}
{{- end -}}
{{- end -}}
{{- end }}
