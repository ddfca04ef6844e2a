package agent

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/spiretest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

// With RootCA spiffe the agent serves Istio's ROOTCA as spire-agent
// v1.13.3 does with default_all_bundles_name = "ROOTCA": given the same
// trust (SPIRE's own roots and a federated peer's, relayed here from a
// trustbridge server), the two answers are equal, down to the validator's
// name and type and each trust domain's roots. Without it, ours is the
// local roots, as Istio's agent serves it.
func TestRootCASPIFFEMatchesSPIRE(t *testing.T) {
	spiretest.RequireAgent(t)
	peer := testca.New(t, "peer.example")
	peerDoc, err := peer.Bundle().Marshal()
	require.NoError(t, err)
	s := spiretest.Start(t, spiretest.Config{TrustDomain: tdA.Name()})
	s.SetBundle(t, "peer.example", peerDoc)
	local, err := s.LocalBundle()
	require.NoError(t, err)
	id := workload.String()
	a := s.StartAgent(t, spiretest.AgentConfig{}) // Istio's names
	e := a.RegisterUID(t, id, os.Getuid(), "peer.example")
	a.WaitSynced(t, e)
	spire := spiretest.EnvoySecrets(t, a.SDS(t), spiretest.RootCAName)[spiretest.RootCAName].Secrets

	// The same trust relayed from a trustbridge server: SPIRE's roots as
	// the local trust domain's, and the peer's. (The server's and the
	// agent's certificates are a CA of our own: only the trust matters.)
	var localRoots []*x509.Certificate
	for _, der := range local.X509Authorities {
		c, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		localRoots = append(localRoots, c)
	}
	trust := sds.NewTrustCell()
	require.NoError(t, trust.Set([]*x509bundle.Bundle{x509bundle.FromX509Authorities(tdA, localRoots), bundleOf(peer)}))
	ca := testca.New(t, tdA.Name())
	up := newUpstream(t, ca, trust, "")
	ours := func(t *testing.T, mode sds.RootCAMode) []spiretest.Secret {
		sock := filepath.Join(shortDir(t), "socket")
		ag := newTestAgent(t, Config{SocketPath: sock, CredentialsDir: filepath.Join(filepath.Dir(sock), "none"), RootCA: mode})
		ag.rot, ag.caAddr = newFakeRotator(t, ca, workload), up.addr
		_, done := runAgent(t, ag)
		waitSocket(t, sock, done)
		return spiretest.EnvoySecrets(t, spiretest.SDSClient(t, sock), spiretest.RootCAName)[spiretest.RootCAName].Secrets
	}

	t.Run("spiffe", func(t *testing.T) {
		got := ours(t, sds.RootCASPIFFE)
		require.Len(t, spire, 1)
		require.NotNil(t, spire[0].ValidationContext)
		require.Len(t, spire[0].ValidationContext.TrustDomains, 2, "SPIRE's ROOTCA holds both trust domains")
		assert.Equal(t, spire, got)
	})
	t.Run("local", func(t *testing.T) {
		got := ours(t, sds.RootCALocal)
		require.Len(t, got, 1)
		require.NotNil(t, got[0].ValidationContext)
		assert.Empty(t, got[0].ValidationContext.Validator, "a plain trusted_ca")
		assert.NotEqual(t, spire, got)
	})
}
