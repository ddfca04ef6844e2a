package server

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTrustbridgeUpstreamFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--upstream-address=corp:15012", "--upstream-prov-cert=d", "--upstream-token-file=t"}, "--upstream-token-file: a trustbridge upstream does not sign intermediates for a bearer token"},
		{[]string{"--upstream-address=corp:15012", "--upstream-prov-cert=d"}, "--upstream-root-cert"},
		{[]string{"--upstream-address=corp:15012", "--upstream-root-cert=/nonexistent/roots.pem", "--upstream-prov-cert=d"}, "--upstream-root-cert"},
	} {
		f := pflag.NewFlagSet("t", pflag.ContinueOnError)
		var o TrustbridgeUpstreamConfig
		addTrustbridgeUpstreamFlags(f, &o)
		require.NoError(t, f.Parse(tc.args))
		_, err := newTrustbridgeUpstreamClient(o)
		assert.ErrorContains(t, err, tc.want, "%v", tc.args)
	}
}

func TestDownstreamAllowFlag(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("corp.example")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--downstream-allow=spiffe://other.example/region/eu"}, "not in trust domain corp.example"},
		{[]string{"--downstream-allow=corp.example/region/eu"}, "--downstream-allow"},
		{[]string{"--max-downstream-ttl=-1s"}, "--max-downstream-ttl -1s must not be negative"},
	} {
		f := pflag.NewFlagSet("t", pflag.ContinueOnError)
		var o DownstreamConfig
		addDownstreamFlags(f, &o)
		require.NoError(t, f.Parse(tc.args))
		_, err := o.parse(td)
		assert.ErrorContains(t, err, tc.want, "%v", tc.args)
	}
	f := pflag.NewFlagSet("t", pflag.ContinueOnError)
	var o DownstreamConfig
	addDownstreamFlags(f, &o)
	require.NoError(t, f.Parse([]string{"--downstream-allow=spiffe://corp.example/region/eu", "--downstream-allow=spiffe://corp.example/region/us"}))
	ids, err := o.parse(td)
	require.NoError(t, err)
	assert.Len(t, ids, 2)
}
