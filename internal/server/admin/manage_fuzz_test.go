package admin

import (
	"net/http"
	"net/url"
	"slices"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// FuzzMutationBodies sends arbitrary bodies to the admin API's three
// routes that parse one (add a relationship, update one, set a bundle), as a caller holding
// the admin token: whatever the body, the answer is never a server error,
// and what is accepted never touches this server's own trust domain or
// one another source configures.
func FuzzMutationBodies(f *testing.F) {
	f.Add([]byte(webEntry("web.example")), "static.example", false)
	f.Add([]byte(`{"federation":[{"trustDomain":"x"}]}`), "x", true)
	f.Add([]byte(`{"federation":[{"trustDomain":"spiffe.example","bundleEndpointURL":"https://127.0.0.1/","bundleEndpointProfile":{"type":"https_spiffe","endpointSPIFFEID":"spiffe://spiffe.example/b"},"trustDomainBundle":"{\"keys\":[]}"}]}`), "spiffe.example", false)
	f.Add([]byte("federation:\n- trustDomain: y.example\n  bundleEndpointURL: https://y.example/\n  bundleEndpointProfile: {type: https_web}\n"), "example.org", false)
	f.Add([]byte(`{"keys":[{"kty":"EC","use":"x509-svid","x5c":["AAAA"]}],"spiffe_sequence":1}`), "peer.example", true)
	f.Add([]byte(`{"keys":[{"kty":"EC","use":"jwt-svid","kid":"k","crv":"P-256","x":"","y":""}]}`), "static.example", false)
	f.Add(testca.PEM(testca.New(f, "static.example").Cert), "static.example", false)
	f.Add([]byte(`{"endpoint_url":"https://patched2.example/","profile":"https_spiffe","endpoint_spiffe_id":"spiffe://patched.example/b"}`), "x", false)
	f.Add([]byte(`{"profile":"https_web","trust_domain_bundle":"{\"keys\":[]}"}`), "x", false)
	f.Fuzz(func(t *testing.T, body []byte, td string, force bool) {
		if len(body) > 64<<10 {
			return
		}
		fx := newManagedFixture(t)
		h := New(fx.cfg)
		add := "/v1/federation/relationships?no_fetch"
		if force {
			add += "&force"
		}
		before := len(fx.m.State().Endpoints)
		rec := send(t, h, http.MethodPost, add, string(body), bearer...)
		checkAnswer(t, "add", rec.Code)
		if rec.Code == http.StatusCreated {
			eps := fx.m.State().Endpoints
			if len(eps) != before+1 {
				t.Fatalf("add answered 201 but holds %d endpoints (was %d)", len(eps), before)
			}
			for _, ep := range eps {
				checkForeign(t, "add", ep.TrustDomain)
			}
		}

		// The body as a patch of a run-time https_web endpoint.
		rec = send(t, h, http.MethodPost, "/v1/federation/relationships?no_fetch&force", webEntry("patched.example"), bearer...)
		if rec.Code != http.StatusCreated {
			t.Fatalf("adding the endpoint to patch answered %d: %s", rec.Code, rec.Body)
		}
		rec = send(t, h, http.MethodPatch, "/v1/federation/relationships/patched.example?no_fetch", string(body), bearer...)
		checkAnswer(t, "update", rec.Code)
		for _, ep := range fx.m.State().Endpoints {
			checkForeign(t, "update", ep.TrustDomain)
			if ep.Profile == federation.ProfileHTTPSSPIFFE && ep.EndpointSPIFFEID.IsZero() {
				t.Fatalf("update made %s https_spiffe without an endpoint SPIFFE ID", ep.TrustDomain)
			}
		}

		rec = send(t, h, http.MethodPut, "/v1/bundles/"+url.PathEscape(td), string(body), bearer...)
		checkAnswer(t, "set bundle", rec.Code)
		if rec.Code == http.StatusOK {
			got := fx.m.State().TrustDomains()
			want, err := spiffeid.TrustDomainFromString(td)
			if err != nil || !slices.Contains(got, want) {
				t.Fatalf("set bundle for %q answered 200 but the state holds %v", td, got)
			}
			for _, b := range fx.m.State().Bundles {
				checkForeign(t, "set bundle", b.TrustDomain())
				for _, c := range b.X509Authorities() {
					if !c.IsCA {
						t.Fatalf("set bundle stored a non-CA certificate for %s", b.TrustDomain())
					}
				}
			}
		}
	})
}

func checkAnswer(t *testing.T, what string, code int) {
	t.Helper()
	if code >= 500 || code < 200 {
		t.Fatalf("%s answered %d", what, code)
	}
}

// checkForeign fails if td is one the admin API must never change.
func checkForeign(t *testing.T, what string, td spiffeid.TrustDomain) {
	t.Helper()
	if td == localTD || td == peerTD {
		t.Fatalf("%s changed %s, which it must refuse", what, td)
	}
}
