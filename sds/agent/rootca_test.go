package agent

import (
	"path/filepath"
	"slices"
	"testing"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/sds"
)

// An agent with RootCA spiffe serves ROOTCA as its ALL: the SPIFFE
// validator with the trust domains the server's policy grants the
// workload and their peer limits, which is what an Istio sidecar, asking
// for ROOTCA only, gets. spiffe://<local td> stays the local roots; a
// trust domain the server takes away leaves ROOTCA too.
func TestRunCARootCASPIFFE(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "socket")
	caA, caB, caC := testca.New(t, tdA.Name()), testca.New(t, tdB.Name()), testca.New(t, tdC.Name())
	trust := sds.NewTrustCell()
	require.NoError(t, trust.Set([]*x509bundle.Bundle{bundleOf(caA), bundleOf(caB), bundleOf(caC)}))
	peer := "spiffe://b.test/ns/billing/sa/api"
	compile := func(grants ...trustpolicy.TrustDomainGrant) *trustpolicy.Policy {
		p, err := trustpolicy.Compile(tdA, trustpolicy.DefaultDeny, []trustpolicy.Rule{{Name: "web", Origin: "test",
			Workloads: []trustpolicy.Selector{{SPIFFEID: workload.String()}}, TrustDomains: grants}})
		require.NoError(t, err)
		return p
	}
	cell := trustpolicy.NewCell(compile(
		trustpolicy.TrustDomainGrant{TrustDomain: "b.test", Peers: []string{peer}},
		trustpolicy.TrustDomainGrant{TrustDomain: "c.test"}))
	up := newUpstreamWith(t, caA, trust, "", trustpolicy.NewAccess(cell, nil))

	a := newTestAgent(t, Config{SocketPath: sock, CredentialsDir: filepath.Join(dir, "none"), RootCA: sds.RootCASPIFFE,
		Registerer: prometheus.NewRegistry()})
	a.rot, a.caAddr = newFakeRotator(t, caA, workload), up.addr
	_, done := runAgent(t, a)
	waitSocket(t, sock, done)

	names := []string{sds.RootCAName, sds.AllName, "spiffe://a.test"}
	s := mustStream(t, sock, names...)
	got := collect(t, s, func(m map[string]*tlsv3.Secret) bool {
		return hasAll(names...)(m) && slices.Equal(trustDomainsOf(t, m[sds.RootCAName]), []string{"a.test", "b.test", "c.test"})
	}, names...)
	assert.True(t, proto.Equal(got[sds.AllName].GetValidationContext(), got[sds.RootCAName].GetValidationContext()), "ROOTCA is ALL")
	assert.Equal(t, []string{"prefix:spiffe://a.test/", "exact:" + peer, "prefix:spiffe://c.test/"}, sanStrings(got[sds.RootCAName].GetValidationContext()))
	roots, err := parseRootsSource(got["spiffe://a.test"].GetValidationContext().GetTrustedCa())
	require.NoError(t, err)
	require.Len(t, roots, 1)
	assert.Equal(t, caA.Cert.Raw, roots[0].Raw, "spiffe://<local td> is the local roots alone")

	// The server's policy takes c.test away: the new ROOTCA is pushed.
	cell.Set(compile(trustpolicy.TrustDomainGrant{TrustDomain: "b.test", Peers: []string{peer}}))
	got = collect(t, s, func(m map[string]*tlsv3.Secret) bool {
		return slices.Equal(trustDomainsOf(t, m[sds.RootCAName]), []string{"a.test", "b.test"})
	}, names...)
	assert.Equal(t, []string{"prefix:spiffe://a.test/", "exact:" + peer}, sanStrings(got[sds.RootCAName].GetValidationContext()))
}

// Without RootCA the agent's ROOTCA stays the local roots (TestRunFiles);
// a mode it does not know is refused at New.
func TestNewRootCAMode(t *testing.T) {
	_, err := New(Config{RootCA: "all"})
	assert.ErrorContains(t, err, `unknown ROOTCA mode "all"`)
	a, err := New(Config{})
	require.NoError(t, err)
	assert.Equal(t, sds.RootCALocal, a.rootCA)
}
