package bundleserver

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/go-jose/go-jose/v4"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/jwtsvid"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Paths under an issuer URL's path: the discovery document where OpenID
// Connect Discovery 1.0 §4 puts it, and the JWKS at SPIRE's OIDC
// Discovery Provider's path, which operators coming from SPIRE know.
const (
	DiscoveryPath = "/.well-known/openid-configuration"
	JWKSPath      = "/keys"
)

// minIssuerRSABits is the smallest RSA key published: relying parties
// refuse smaller ones (AWS and Azure ask for 2048 bits).
const minIssuerRSABits = jwtsvid.MinRSABits

// Issuer is an OIDC issuer the server publishes: the discovery document
// at URL+DiscoveryPath and the JWKS at URL+JWKSPath, made of the JWT
// authorities of the bundle Source provides, which must be TrustDomain's.
// Relying parties (AWS IAM, GCP workload identity federation, Azure,
// Vault) trust JWT-SVIDs whose iss is URL through them, so Source decides
// whose tokens they accept: give it only a bundle whose keys are the
// issuer's own (the local CA's, or a file its operator relays), never a
// federated peer's. NewEndpoint fills a missing Source with exactly those.
type Issuer struct {
	URL         string
	TrustDomain spiffeid.TrustDomain
	Source      Source
}

// issuerRoute is one of an issuer's two documents.
type issuerRoute struct {
	issuer int
	jwks   bool
}

// issuerDocs are an issuer's rendered documents; both nil while its
// bundle has no JWT authority that can be published (503).
type issuerDocs struct {
	src             *spiffebundle.Bundle
	discovery, jwks *document
	// keys and algs describe what jwks publishes, for IssuerStates.
	keys []IssuerKey
	algs []string
}

// IssuerKey is a key an issuer's JWKS publishes.
type IssuerKey struct {
	KeyID, Algorithm, Use string
}

// IssuerState is what an issuer serves now, for status pages and audits.
type IssuerState struct {
	URL, DiscoveryURL, JWKSURL string
	TrustDomain                spiffeid.TrustDomain
	// Keys are the JWKS's keys; none while the bundle has no JWT
	// authority (both documents answer 503 then).
	Keys       []IssuerKey
	Algorithms []string
	// JWKS is the JWKS document served now, byte for byte (nil while it
	// answers 503), for audits that judge what relying parties get.
	JWKS []byte
	// Err is why the latest bundle's keys are not all published.
	Err error
}

// discoveryDoc is the OpenID Connect Discovery 1.0 §3 metadata of an
// issuer that only signs tokens. authorization_endpoint is left out,
// though §3 lists it as required: there is none, and the relying parties
// that verify tokens never read it (Kubernetes' service account issuer
// discovery leaves it out for the same reason). Nothing here is invented:
// the algorithms are those of the keys published, the claims those every
// JWT-SVID carries.
type discoveryDoc struct {
	Issuer             string   `json:"issuer"`
	JWKSURI            string   `json:"jwks_uri"`
	ResponseTypes      []string `json:"response_types_supported"`
	SubjectTypes       []string `json:"subject_types_supported"`
	IDTokenSigningAlgs []string `json:"id_token_signing_alg_values_supported"`
	ClaimsSupported    []string `json:"claims_supported"`
}

// checkIssuers validates the configured issuers: each URL an issuer
// (jwtsvid.ParseIssuer) with a source, and no two issuers' documents, or
// an issuer's and a bundle route, on one path.
func (c *Config) checkIssuers() (map[string]issuerRoute, error) {
	urls := make([]string, len(c.Issuers))
	for i, iss := range c.Issuers {
		if iss.TrustDomain.IsZero() || iss.Source == nil {
			return nil, fmt.Errorf("issuer %q: a trust domain and its bundle source are required", iss.URL)
		}
		urls[i] = iss.URL
	}
	return issuerRoutes(c.Path, urls)
}

// CheckIssuerPaths reports what New would refuse of issuers served
// beside the local bundle at bundlePath: an issuer URL that is not one
// (jwtsvid.ParseIssuer), or whose documents' paths collide with the
// bundle routes or another issuer's. An error names the issuer by URL.
func CheckIssuerPaths(bundlePath string, issuerURLs []string) error {
	_, err := issuerRoutes(bundlePath, issuerURLs)
	return err
}

func issuerRoutes(bundlePath string, urls []string) (map[string]issuerRoute, error) {
	routes := map[string]issuerRoute{}
	for i, raw := range urls {
		u, err := jwtsvid.ParseIssuer(raw)
		if err != nil {
			return nil, err
		}
		for _, r := range []issuerRoute{{i, false}, {i, true}} {
			p := u.Path + DiscoveryPath
			if r.jwks {
				p = u.Path + JWKSPath
			}
			if err := checkIssuerPath(p, bundlePath); err != nil {
				return nil, fmt.Errorf("issuer %q: %s: %w", raw, p, err)
			}
			if prev, dup := routes[p]; dup {
				return nil, fmt.Errorf("issuer %q: %s is already issuer %q's", raw, p, urls[prev.issuer])
			}
			routes[p] = r
		}
	}
	return routes, nil
}

func checkIssuerPath(p, bundlePath string) error {
	switch {
	case p == bundlePath:
		return errors.New("is the local bundle's path (--bundle-path)")
	case p == BundleMapPath || strings.HasPrefix(p, BundlesPrefix):
		return fmt.Errorf("collides with the %s and %s{trustDomain} routes", BundleMapPath, BundlesPrefix)
	}
	return nil
}

func (s *Server) serveIssuer(w http.ResponseWriter, r *http.Request, ir issuerRoute) {
	route := routeDiscovery
	if ir.jwks {
		route = routeJWKS
	}
	if !s.methodAllowed(w, r, route) {
		return
	}
	docs := s.snap.Load().issuers[ir.issuer]
	doc := docs.discovery
	if ir.jwks {
		doc = docs.jwks
	}
	if doc == nil {
		h := w.Header()
		h["Retry-After"] = retryHdr
		s.fail(w, route, http.StatusServiceUnavailable, "503 no JWT authority published for this issuer yet\n")
		return
	}
	s.serveDoc(w, r, route, doc)
}

// renderIssuers renders every issuer's documents into next, reusing
// prev's where the issuer's source returned the same bundle.
func (s *Server) renderIssuers(prev, next *snapshot) []error {
	var errs []error
	next.issuers = make([]issuerDocs, len(s.cfg.Issuers))
	for i, iss := range s.cfg.Issuers {
		var old issuerDocs
		if i < len(prev.issuers) {
			old = prev.issuers[i]
		}
		src := iss.Source.Bundle()
		if src == nil || src == old.src {
			// No bundle yet, or the same: keep what is served.
			next.issuers[i] = old
			if r, ok := s.refused[issuerKey+iss.URL]; ok && r.src == src && src != nil {
				errs = append(errs, r.err)
			}
			continue
		}
		docs, err := s.renderIssuer(iss, src)
		if err != nil {
			err = s.refuse(issuerKey+iss.URL, src, nil, err)
			errs = append(errs, err)
		} else {
			delete(s.refused, issuerKey+iss.URL)
		}
		next.issuers[i] = docs
	}
	return errs
}

// issuerKey prefixes an issuer's refusals among the trust domains'.
const issuerKey = "issuer "

// renderIssuer renders iss's documents from src. Keys that cannot be
// published (an algorithm relying parties do not take) are left out and
// named in the error; the rest are published. A bundle of another trust
// domain publishes nothing.
func (s *Server) renderIssuer(iss Issuer, src *spiffebundle.Bundle) (issuerDocs, error) {
	docs := issuerDocs{src: src}
	if src.TrustDomain() != iss.TrustDomain {
		return docs, fmt.Errorf("bundle is for trust domain %q, not the issuer's %q; nothing published", src.TrustDomain().Name(), iss.TrustDomain.Name())
	}
	auths := src.JWTAuthorities()
	set := jose.JSONWebKeySet{Keys: make([]jose.JSONWebKey, 0, len(auths))}
	algs := map[string]bool{}
	var skipped []error
	for _, kid := range slices.Sorted(maps.Keys(auths)) {
		alg, err := jwkAlgorithm(auths[kid])
		if err != nil {
			skipped = append(skipped, fmt.Errorf("JWT authority %q: %w", kid, err))
			continue
		}
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: auths[kid], KeyID: kid, Algorithm: alg, Use: "sig"})
		docs.keys = append(docs.keys, IssuerKey{KeyID: kid, Algorithm: alg, Use: "sig"})
		algs[alg] = true
	}
	if len(set.Keys) == 0 {
		skipped = append(skipped, errors.New("no JWT authority to publish; the discovery document and JWKS answer 503 until one is"))
		return issuerDocs{src: src}, errors.Join(skipped...)
	}
	docs.algs = slices.Sorted(maps.Keys(algs))
	jwks, err := json.Marshal(set)
	if err != nil {
		return issuerDocs{src: src}, fmt.Errorf("JWKS: %w", err)
	}
	disc, err := json.Marshal(discoveryDoc{
		Issuer: iss.URL, JWKSURI: iss.URL + JWKSPath,
		ResponseTypes: []string{"id_token"}, SubjectTypes: []string{"public"},
		IDTokenSigningAlgs: docs.algs,
		ClaimsSupported:    []string{"sub", "aud", "exp", "iat", "iss"},
	})
	if err != nil {
		return issuerDocs{src: src}, fmt.Errorf("discovery document: %w", err)
	}
	age := cacheAge(src)
	docs.discovery = newDocument(nil, nil, disc, age)
	docs.jwks = newDocument(nil, nil, jwks, age)
	return docs, errors.Join(skipped...)
}

// jwkAlgorithm is the JWS algorithm a JWT authority signs with, as the
// JWKS states it: ES256, ES384 or ES512 by curve, RS256 for RSA of at
// least minIssuerRSABits (the algorithm SPIFFE implementations sign RSA
// JWT-SVIDs with), EdDSA for Ed25519.
func jwkAlgorithm(pub crypto.PublicKey) (string, error) {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return string(jose.ES256), nil
		case elliptic.P384():
			return string(jose.ES384), nil
		case elliptic.P521():
			return string(jose.ES512), nil
		}
		return "", fmt.Errorf("ECDSA curve %s has no JWS algorithm", k.Curve.Params().Name)
	case *rsa.PublicKey:
		if k.N.BitLen() < minIssuerRSABits {
			return "", fmt.Errorf("RSA key of %d bits; relying parties want at least %d", k.N.BitLen(), minIssuerRSABits)
		}
		return string(jose.RS256), nil
	case ed25519.PublicKey:
		return string(jose.EdDSA), nil
	}
	return "", fmt.Errorf("key type %T has no JWS algorithm", pub)
}

// IssuerStates reports what each configured issuer serves now.
func (s *Server) IssuerStates() []IssuerState {
	snap := s.snap.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]IssuerState, len(s.cfg.Issuers))
	for i, iss := range s.cfg.Issuers {
		st := IssuerState{URL: iss.URL, DiscoveryURL: iss.URL + DiscoveryPath, JWKSURL: iss.URL + JWKSPath, TrustDomain: iss.TrustDomain}
		if i < len(snap.issuers) {
			d := snap.issuers[i]
			st.Keys, st.Algorithms = slices.Clone(d.keys), slices.Clone(d.algs)
			if d.jwks != nil {
				st.JWKS = slices.Clone(d.jwks.body)
			}
		}
		if r, ok := s.refused[issuerKey+iss.URL]; ok {
			st.Err = r.err
		}
		out[i] = st
	}
	return out
}

// logIssuers logs each issuer whose JWKS changed.
func (s *Server) logIssuers(prev, next *snapshot) {
	for i, d := range next.issuers {
		var old *document
		if i < len(prev.issuers) {
			old = prev.issuers[i].jwks
		}
		if d.jwks == old || (d.jwks != nil && old != nil && d.jwks.etag == old.etag) {
			continue
		}
		iss := s.cfg.Issuers[i]
		s.logger.Info("serving OIDC issuer", logattr.Issuer, iss.URL, logattr.TrustDomain, iss.TrustDomain.Name(),
			"keys", len(d.keys), "algorithms", strings.Join(d.algs, ","))
	}
}
