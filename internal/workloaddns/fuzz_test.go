package workloaddns

import (
	"crypto/x509"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn"
)

// FuzzTemplate parses templates and expands them for arbitrary namespace
// and service account values: whatever comes out must be one valid,
// non-wildcard DNS name that contains both values as whole labels, and
// the ID's values must decide it (Parse never accepts an ambiguous
// template).
func FuzzTemplate(f *testing.F) {
	for _, s := range [][3]string{
		{"{sa}.{ns}.{td}", "prod", "web"},
		{"{sa}.{ns}.svc.cluster.local", "prod", "web.internal"},
		{"{ns}.{sa}", "prod", "123"},
		{"{ns}.{sa}.mesh", "prod", "123"},
		{"{sa}.{ns}", "com", "google"},
		{"{sa}{ns}", "a", "b"},
		{"*.{sa}.{ns}", "a", "b"},
		{"{sa}.{ns}.{td}", "PROD", "-web"},
		{"{sa}.{ns}.{td", "a", "b"},
		{"{sa}.{ns}." + strings.Repeat("x", 63), strings.Repeat("n", 63), strings.Repeat("s", 63)},
		{"{sa}.{ns}.b\u00fccher", "a", "b"},
		{"{{sa}}.{ns}", "a", "b"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, template, ns, sa string) {
		tmpl, err := Parse(template, td)
		if err != nil {
			return
		}
		id, err := spiffeid.FromSegments(td, "ns", ns, "sa", sa)
		if err != nil {
			return
		}
		names, err := tmpl.Names(id, authn.Grant{Method: authn.MethodKubernetesJWT, Ref: ns + "/" + sa})
		if err != nil {
			require.ErrorIs(t, err, ErrSkipped)
			require.Nil(t, names)
			return
		}
		require.Len(t, names, 1)
		name := names[0]
		require.NoError(t, CheckName(name))
		assert.NotContains(t, name, "*")
		labels := strings.Split(name, ".")
		assert.Contains(t, labels, ns)
		assert.Contains(t, labels, sa)
		// The zone is the template's, whatever the values: the last
		// label is the one namespace "a" and service account "a" get.
		fixed, err := tmpl.Names(spiffeid.RequireFromSegments(td, "ns", "a", "sa", "a"), authn.Grant{Method: authn.MethodKubernetesIssuer})
		require.NoError(t, err)
		assert.Equal(t, labels[len(labels)-1], fixed[0][strings.LastIndexByte(fixed[0], '.')+1:])
		// A certificate carrying it passes crypto/x509's host name check.
		assert.NoError(t, (&x509.Certificate{DNSNames: names}).VerifyHostname(name))
		// Another workload never gets the same name.
		if other, err := tmpl.Names(spiffeid.RequireFromSegments(td, "ns", ns, "sa", sa+"x"),
			authn.Grant{Method: authn.MethodKubernetesIssuer}); err == nil {
			assert.NotEqual(t, names, other)
		}
	})
}
