package server

import (
	"crypto/x509"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

// e2eServer is one running trustbridge server of a federation test.
type e2eServer struct {
	td        spiffeid.TrustDomain
	dataDir   string
	admin     string // http://host:port of the admin API
	bundleURL string // the bundle endpoint as the banner names it
	banner    string
	stop      func()
}

// startE2EServer runs a server for td on dataDir until stop or the end of
// the test. Unlike startNamedServer it can be stopped early, which the
// bootstrap of an https_spiffe pair needs.
func startE2EServer(t *testing.T, td, dataDir string, mutate func(*Config)) *e2eServer {
	t.Helper()
	o := baseServerOptions(td, dataDir)
	o.Bundle = BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, ServeOthers: true}
	o.Federation.MinRefresh = time.Second
	o.Federation.AllowPrivate = true
	if mutate != nil {
		mutate(&o)
	}
	admin, banner, stop := launchServer(t, o)
	return &e2eServer{
		td: spiffeid.RequireTrustDomainFromString(td), dataDir: dataDir, admin: "http://" + admin,
		bundleURL: servertest.EndpointURL(t, banner), banner: banner, stop: stop,
	}
}

// bootstrapDataDir starts and stops a server once so that its data dir
// holds a CA, and returns that CA's roots: the bundle an operator hands a
// peer out of band before https_spiffe can work.
func bootstrapDataDir(t *testing.T, td string) (dataDir string, roots []*x509.Certificate) {
	t.Helper()
	dataDir = t.TempDir()
	startE2EServer(t, td, dataDir, nil).stop()
	_, rs, err := ca.NewStore(dataDir).Load(td)
	require.NoError(t, err)
	for _, r := range rs {
		roots = append(roots, r.Cert)
	}
	require.NotEmpty(t, roots)
	return dataDir, roots
}

// startSPIFFEPair starts east.example and west.example federated with each
// other over https_spiffe. A CA root exists only after a server's first
// start and the peer's config needs it, so each data dir is bootstrapped
// first and the bundle endpoints then get ports reserved up front.
func startSPIFFEPair(t *testing.T, eastMutate, westMutate func(*Config)) (east, west *e2eServer) {
	t.Helper()
	eastData, eastRoots := bootstrapDataDir(t, "east.example")
	westData, westRoots := bootstrapDataDir(t, "west.example")
	eastAddr, westAddr := servertest.ReservePort(t), servertest.ReservePort(t)
	eastCfg := servertest.WriteSPIFFEFederationConfig(t, "west.example", westAddr, westRoots)
	westCfg := servertest.WriteSPIFFEFederationConfig(t, "east.example", eastAddr, eastRoots)
	east = startE2EServer(t, "east.example", eastData, func(o *Config) {
		o.Bundle.Listen = eastAddr
		o.Federation.ConfigFile = eastCfg
		if eastMutate != nil {
			eastMutate(o)
		}
	})
	west = startE2EServer(t, "west.example", westData, func(o *Config) {
		o.Bundle.Listen = westAddr
		o.Federation.ConfigFile = westCfg
		if westMutate != nil {
			westMutate(o)
		}
	})
	return east, west
}

// federationStatus reads s's GET /v1/federation entry for td; ok is false
// while there is none yet.
func federationStatus(t *testing.T, s *e2eServer, td string) (api.FederationStatus, bool) {
	t.Helper()
	code, body := servertest.Get(t, s.admin+"/v1/federation")
	var all []api.FederationStatus
	if code != http.StatusOK || json.Unmarshal([]byte(body), &all) != nil {
		return api.FederationStatus{}, false
	}
	for _, st := range all {
		if st.TrustDomain == td {
			return st, true
		}
	}
	return api.FederationStatus{}, false
}

// waitFederated waits until s holds a bundle of td fetched from its
// endpoint, with at least sequence minSeq.
func waitFederated(t *testing.T, s *e2eServer, td string, minSeq uint64, timeout time.Duration) api.FederationStatus {
	t.Helper()
	var st api.FederationStatus
	require.Eventually(t, func() bool {
		var ok bool
		st, ok = federationStatus(t, s, td)
		return ok && st.State == string(federation.StateOK) && st.LastSuccess != nil && st.Sequence != nil && *st.Sequence >= minSeq
	}, timeout, 20*time.Millisecond, "%s never federated with %s (seq >= %d): last status %+v", s.td.Name(), td, minSeq, st)
	return st
}

func caRootsOf(t *testing.T, s *e2eServer) []*x509.Certificate {
	t.Helper()
	_, rs, err := ca.NewStore(s.dataDir).Load(s.td.Name())
	require.NoError(t, err)
	var roots []*x509.Certificate
	for _, r := range rs {
		roots = append(roots, r.Cert)
	}
	return roots
}
