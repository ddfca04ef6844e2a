package identitymap

import (
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn/idtemplate"
)

var localTD = spiffeid.RequireTrustDomainFromString("example.org")

func pod(ns, sa string, labels map[string]string) Workload {
	return Workload{Kubernetes: true, Namespace: ns, ServiceAccount: sa, PodName: "p-1", PodUID: "0f1e2d3c", PodLabels: labels,
		NodeName: "node-a", ContainerName: "app", Unix: true, UID: 1000, GID: 1000}
}

func TestParseIDTemplate(t *testing.T) {
	for _, tc := range []struct {
		name, tmpl, err string
	}{
		{"istio form", "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/sa/{{.ServiceAccount}}", ""},
		{"spaces in braces", "spiffe://{{ .TrustDomain }}/ns/{{ .Namespace }}", ""},
		{"literal trust domain", "spiffe://example.org/w/{{.PodLabels.app}}", ""},
		{"qualified label key", "spiffe://{{.TrustDomain}}/app/{{.PodLabels.app.kubernetes.io/name}}", ""},
		{"literal beside a fact", "spiffe://{{.TrustDomain}}/uid-{{.UID}}", ""},
		{"function", "spiffe://{{.TrustDomain}}/{{printf \"%s\" .Namespace}}", "is not one of"},
		{"pipeline", "spiffe://{{.TrustDomain}}/{{.Namespace | lower}}", "is not one of"},
		{"unknown fact", "spiffe://{{.TrustDomain}}/{{.Nmespace}}", "is not one of"},
		{"binary path is not a placeholder", "spiffe://{{.TrustDomain}}/{{.BinaryPath}}", "is not one of"},
		{"bad label key", "spiffe://{{.TrustDomain}}/{{.PodLabels.a b}}", "is not a label key"},
		{"two facts in a segment", "spiffe://{{.TrustDomain}}/{{.Namespace}}-{{.PodName}}", "second placeholder in one path segment"},
		{"unclosed", "spiffe://{{.TrustDomain}}/{{.Namespace", "not closed"},
		{"stray brace", "spiffe://{{.TrustDomain}}/a}", "stray"},
		{"no scheme", "{{.TrustDomain}}/ns/{{.Namespace}}", "must start with"},
		{"http", "https://{{.TrustDomain}}/x", "must start with"},
		{"trust domain in the path", "spiffe://{{.TrustDomain}}/{{.TrustDomain}}", "only allowed as the trust domain"},
		{"root ID", "spiffe://{{.TrustDomain}}", "non-root SPIFFE ID path"},
		{"trust domain extended", "spiffe://{{.TrustDomain}}.evil.example/x", "non-root SPIFFE ID path"},
		{"userinfo", "spiffe://{{.Namespace}}@{{.TrustDomain}}/x", "must start with"},
		{"root path", "spiffe://{{.TrustDomain}}/", "non-root SPIFFE ID path"},
		{"empty segment", "spiffe://{{.TrustDomain}}/a//{{.Namespace}}", "non-root SPIFFE ID path"},
		{"dot dot", "spiffe://{{.TrustDomain}}/../{{.Namespace}}", "non-root SPIFFE ID path"},
		{"trailing slash", "spiffe://{{.TrustDomain}}/a/", "non-root SPIFFE ID path"},
		{"percent", "spiffe://{{.TrustDomain}}/a%2Fb", "non-root SPIFFE ID path"},
		{"bad trust domain", "spiffe://Exa mple/x", "is not a trust domain"},
		{"too long", "spiffe://{{.TrustDomain}}/" + strings.Repeat("a", idtemplate.MaxTemplateLen), "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseIDTemplate(tc.tmpl)
			if tc.err == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tc.err)
			}
		})
	}
}

func TestIDTemplateValues(t *testing.T) {
	tmpl := "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}/app/{{.PodLabels.app}}"
	for _, tc := range []struct {
		name, app, want, err string
		noLabel              bool
	}{
		{name: "plain", app: "web", want: "spiffe://example.org/ns/pay/app/web"},
		{name: "upper case and underscore", app: "Web_1.x", want: "spiffe://example.org/ns/pay/app/Web_1.x"},
		{name: "slash injects a segment", app: "web/../../x", err: "is not one of A-Z"},
		{name: "slash", app: "/", err: "is not one of A-Z"},
		{name: "dot dot", app: "..", err: "relative path segment"},
		{name: "dot", app: ".", err: "relative path segment"},
		{name: "empty", app: "", err: "value is empty"},
		{name: "missing", noLabel: true, err: `no label "app"`},
		{name: "percent-encoded slash", app: "a%2Fb", err: "is not one of A-Z"},
		{name: "unicode look-alike", app: "wеb", err: "is not one of A-Z"},
		{name: "space", app: "a b", err: "is not one of A-Z"},
		{name: "authority escape", app: "@evil.example", err: "is not one of A-Z"},
		{name: "very long label", app: strings.Repeat("a", 300), err: "more than 255"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpl, err := parseIDTemplate(tmpl)
			require.NoError(t, err)
			labels := map[string]string{"app": tc.app}
			if tc.noLabel {
				labels = map[string]string{}
			}
			w := pod("pay", "api", labels)
			id, err := tpl.id(localTD, &w)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				assert.True(t, id.IsZero())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, id.String())
		})
	}
}

func TestIDTemplateMissingFacts(t *testing.T) {
	proc := Workload{Unix: true, UID: 0, GID: 0}
	k8sOnly := Workload{Kubernetes: true, Namespace: "pay", ServiceAccount: "api"}
	for _, tc := range []struct {
		name, tmpl, want, err string
		w                     Workload
	}{
		{"uid 0 is a fact", "spiffe://{{.TrustDomain}}/uid/{{.UID}}", "spiffe://example.org/uid/0", "", proc},
		{"kubernetes fact of a process", "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}", "", "not a Kubernetes workload", proc},
		{"label of a process", "spiffe://{{.TrustDomain}}/{{.PodLabels.app}}", "", "not a Kubernetes workload", proc},
		{"unix fact the server does not have", "spiffe://{{.TrustDomain}}/uid/{{.UID}}", "", "no unix facts", k8sOnly},
		{"unknown user name", "spiffe://{{.TrustDomain}}/user/{{.User}}", "", "not known", proc},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpl, err := parseIDTemplate(tc.tmpl)
			require.NoError(t, err)
			id, err := tpl.id(localTD, &tc.w)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, id.String())
		})
	}
}

func TestCanonical(t *testing.T) {
	a, err := parseIDTemplate("spiffe://example.org/ns/{{ .Namespace }}")
	require.NoError(t, err)
	b, err := parseIDTemplate("spiffe://{{.TrustDomain}}/ns/{{.Namespace}}")
	require.NoError(t, err)
	assert.Equal(t, b.canonical(), a.canonical())
	assert.Equal(t, "spiffe://{{.TrustDomain}}/ns/{{.Namespace}}", a.canonical())
}

func TestDNSTemplate(t *testing.T) {
	for _, tc := range []struct {
		name, tmpl, app, want, err string
	}{
		{name: "service name", tmpl: "{{.PodLabels.app}}.{{.Namespace}}.svc.cluster.local", app: "web", want: "web.pay.svc.cluster.local"},
		{name: "trust domain", tmpl: "{{.ServiceAccount}}.{{.TrustDomain}}", want: "api.example.org"},
		{name: "literal beside a fact", tmpl: "app-{{.PodLabels.app}}.internal", app: "web", want: "app-web.internal"},
		{name: "upper case value refused", tmpl: "{{.PodLabels.app}}.internal", app: "Web", err: "lower case"},
		{name: "dot in a value adds a label", tmpl: "{{.PodLabels.app}}.internal", app: "a.b", err: "one DNS label"},
		{name: "underscore", tmpl: "{{.PodLabels.app}}.internal", app: "a_b", err: "one DNS label"},
		{name: "leading hyphen", tmpl: "{{.PodLabels.app}}.internal", app: "-a", err: "not a DNS name"},
		{name: "long value", tmpl: "{{.PodLabels.app}}.internal", app: strings.Repeat("a", 64), err: "more than a DNS label's 63"},
		{name: "long label from literal and value", tmpl: "x{{.PodLabels.app}}.internal", app: strings.Repeat("a", 63), err: "must be no more than 63"},
		{name: "unicode", tmpl: "{{.PodLabels.app}}.internal", app: "wéb", err: "one DNS label"},
		{name: "empty", tmpl: "{{.PodLabels.app}}.internal", app: "", err: "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpl, err := parseDNSTemplate(tc.tmpl)
			require.NoError(t, err)
			w := pod("pay", "api", map[string]string{"app": tc.app})
			name, err := tpl.dnsName(localTD, &w)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, name)
		})
	}
}

func TestParseDNSTemplateRefuses(t *testing.T) {
	for tmpl, want := range map[string]string{
		"*.{{.Namespace}}.svc":                "not allowed in a DNS name",
		"Web.{{.Namespace}}":                  "not allowed in a DNS name",
		"{{.Namespace}}-{{.PodName}}.svc":     "second placeholder in one DNS label",
		"{{.Namespace}}..svc":                 "not a DNS name",
		"{{.Namespace}}.svc.":                 "not a DNS name",
		"{{.Namespace}}/x":                    "not allowed in a DNS name",
		"{{.Foo}}.svc":                        "is not one of",
		strings.Repeat("a", 64) + ".{{.UID}}": "must be no more than 63",
	} {
		_, err := parseDNSTemplate(tmpl)
		assert.ErrorContains(t, err, want, tmpl)
	}
}
