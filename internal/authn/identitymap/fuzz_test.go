package identitymap

import (
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// FuzzTemplate parses a template as a SPIFFE ID template and as a DNS
// name template and fills each from hostile facts: never a panic, never
// an ID outside the trust domain or of another shape than the template,
// never a DNS name that is not a lower case host name.
func FuzzTemplate(f *testing.F) {
	for _, s := range []struct{ tmpl, ns, label string }{
		{istioTmpl, "pay", "web"},
		{appTmpl, "pay", "../../x"},
		{"spiffe://example.org/a/{{.PodLabels.app}}", "pay", "/"},
		{"spiffe://{{.TrustDomain}}/{{.PodLabels.app}}x", "pay", ""},
		{"spiffe://{{ .TrustDomain }}/uid/{{.UID}}/{{.User}}", "pay", "%2F"},
		{"{{.PodLabels.app}}.{{.Namespace}}.svc", "a.b", "WEB"},
		{"{{.ServiceAccount}}.{{.TrustDomain}}", "pay", "wеb"},
		{"spiffe://{{.TrustDomain}}/{{.Namespace}}", "..", "x"},
		{"spiffe://{{.TrustDomain}}{{.Namespace}}/x", "@evil", "x"},
		{"spiffe://{{.TrustDomain}}/{{", "", "}}"},
	} {
		f.Add(s.tmpl, s.ns, s.label)
	}
	f.Fuzz(func(t *testing.T, tmpl, ns, label string) {
		w := Workload{Kubernetes: true, Namespace: ns, ServiceAccount: label, PodName: label, PodLabels: map[string]string{"app": label, "a": ns},
			Unix: true, UID: 7, User: label}
		if tpl, err := parseIDTemplate(tmpl); err == nil && tpl.checkTrustDomain(localTD) == nil {
			id, err := tpl.id(localTD, &w)
			if err == nil {
				checkFuzzedID(t, tmpl, tpl, id)
			}
		}
		if tpl, err := parseDNSTemplate(tmpl); err == nil {
			name, err := tpl.dnsName(localTD, &w)
			if err == nil && (checkDNSName(name) != nil || strings.ContainsAny(name, "*ABCDEFGHIJKLMNOPQRSTUVWXYZ_/")) {
				t.Fatalf("template %q made DNS name %q", tmpl, name)
			}
		}
	})
}

func checkFuzzedID(t *testing.T, tmpl string, tpl *template, id spiffeid.ID) {
	t.Helper()
	again, err := spiffeid.FromString(id.String())
	switch {
	case err != nil || again != id:
		t.Fatalf("template %q made %q, which does not parse back: %v", tmpl, id, err)
	case id.TrustDomain() != localTD:
		t.Fatalf("template %q made %q, outside %s", tmpl, id, localTD)
	case !strings.HasPrefix(id.String(), "spiffe://example.org/"):
		t.Fatalf("template %q made %q", tmpl, id)
	case strings.Count(id.Path(), "/") != tpl.segments:
		t.Fatalf("template %q made %q, of another shape (%d segments)", tmpl, id, tpl.segments)
	}
}
