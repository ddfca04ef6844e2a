package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// config check refuses what the server would stop on: issuers (inline
// here, with the line of the bad one) and a DNS name template, checked
// only when the certificate service is on, and refused when it is off.
func TestConfigCheckOIDCAndDNSTemplate(t *testing.T) {
	t.Setenv("TRUST_DOMAIN", "")
	good := servertest.WriteConfig(t, "trust-domain: example.org\ngrpc-listen: 127.0.0.1:15012\nworkload-dns-name-template: \"{sa}.{ns}.svc.cluster.local\"\noidc:\n"+indent(servertest.CIIssuerYAML, "  "))
	out, stderr, code := runCLI(t, "", "config", "check", good)
	assert.Equal(t, 0, code, stderr+out)

	foreign := strings.Replace(servertest.CIIssuerYAML, "{{.TrustDomain}}", "other.org", 1)
	bad := servertest.WriteConfig(t, "trust-domain: example.org\ngrpc-listen: 127.0.0.1:15012\nworkload-dns-name-template: \"*.{ns}.svc\"\noidc:\n"+indent(foreign, "  "))
	out, _, code = runCLI(t, "", "config", "check", bad)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "--workload-dns-name-template")
	assert.Contains(t, out, "config "+bad+": oidc: ")
	assert.Contains(t, out, `"other.org"`)

	off := servertest.WriteConfig(t, "trust-domain: example.org\ngrpc-listen: \"\"\nworkload-dns-name-template: \"{sa}.{ns}.svc\"\noidc:\n"+indent(servertest.CIIssuerYAML, "  "))
	out, _, code = runCLI(t, "", "config", "check", off)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, `OIDC issuers authenticate callers of the certificate service, which --grpc-listen "" turns off`)
	assert.Contains(t, out, `--workload-dns-name-template names certificates of the certificate service, which --grpc-listen "" turns off`)
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}
