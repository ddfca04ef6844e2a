package admin

import (
	"crypto/x509"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// caMinter signs with the CA's own X509-SVID signer, policy and all, from
// root; it records what it was asked.
type caMinter struct {
	root      *testca.CA
	asked     []spiffeid.ID
	ttls      []time.Duration
	audiences [][]string
}

func (m *caMinter) SignX509SVID(p ca.X509SVIDParams) (*ca.Issued, error) {
	m.asked, m.ttls = append(m.asked, p.SPIFFEID), append(m.ttls, p.TTL)
	return ca.SignX509SVID(time.Now(), ca.SigningMaterial{Cert: m.root.Cert, Key: m.root.Key, Roots: []*x509.Certificate{m.root.Cert}},
		ca.Policy{TrustDomain: m.root.TrustDomain, MaxTTL: 24 * time.Hour}, p)
}

func (m *caMinter) SignJWT(id spiffeid.ID, aud []string, ttl time.Duration) (string, time.Time, error) {
	m.asked, m.ttls, m.audiences = append(m.asked, id), append(m.ttls, ttl), append(m.audiences, aud)
	return "token", time.Now().Add(time.Minute), nil
}

// FuzzMintBodies sends arbitrary bodies to POST /v1/svid/x509 and
// /v1/svid/jwt as a caller holding the admin token: the answer is never a
// server error, the CA is asked only for an identity of our trust domain
// with a path, a lifetime within the maximum and audiences a JWT-SVID may
// name, and each mint, and only a mint, is audited.
func FuzzMintBodies(f *testing.F) {
	csr := csrPEMFor(f)
	for _, seed := range []any{
		api.X509SVIDMint{SPIFFEID: "spiffe://example.org/a", CSR: csr, DNSNames: []string{"a.example.org"}, TTLSeconds: 3600},
		api.X509SVIDMint{SPIFFEID: "spiffe://peer.example/a", CSR: csr},
		api.X509SVIDMint{SPIFFEID: "spiffe://example.org/a", CSR: csr, DNSNames: []string{"*.*", "\u00e9"}, TTLSeconds: 1 << 40},
		api.JWTSVIDMint{SPIFFEID: "spiffe://example.org/a", Audience: []string{"a", "b"}, TTLSeconds: 60},
		api.JWTSVIDMint{SPIFFEID: "spiffe://example.org", Audience: []string{""}},
	} {
		b, err := json.Marshal(seed)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"spiffe_id":"spiffe://example.org/a","csr":"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"}`))
	root := testca.New(f, localTD.Name())
	f.Fuzz(func(t *testing.T, body []byte) {
		fx := newFixture(t)
		m := &caMinter{root: root}
		var entries []audit.Entry
		fx.cfg.Mint, fx.cfg.Token, fx.cfg.MaxWorkloadTTL = m, "s3cret", 24*time.Hour
		fx.cfg.Audit = func(e audit.Entry) { entries = append(entries, e) }
		h := New(fx.cfg)
		minted := 0
		for _, target := range []string{"/v1/svid/x509", "/v1/svid/jwt"} {
			rec := post(t, h, target, string(body), "Authorization", "Bearer s3cret")
			checkAnswer(t, target, rec.Code)
			if rec.Code == http.StatusOK {
				minted++
			}
		}
		for i, id := range m.asked {
			if !id.MemberOf(localTD) || id.Path() == "" {
				t.Fatalf("the CA was asked for %s", id)
			}
			if m.ttls[i] < 0 || m.ttls[i] > 365*24*time.Hour {
				t.Fatalf("the CA was asked for a lifetime of %s", m.ttls[i])
			}
		}
		if len(entries) != minted {
			t.Fatalf("%d mints answered 200, %d audited", minted, len(entries))
		}
		for _, aud := range m.audiences {
			if err := certservice.CheckAudiences(aud); err != nil {
				t.Fatalf("the CA was asked for a JWT-SVID for audiences %q: %v", aud, err)
			}
		}
	})
}
