package ca

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
)

// signer is the signing half of the CA, SPIRE's ca.CA: it signs
// X509-SVIDs, serving certificates, downstream intermediates and
// JWT-SVIDs with what the manager last published on the board, and
// answers from it what a verifier of its leaves asks (Bundle,
// IssuedHere). It takes no lock, but waits for a change under way (see
// board).
type signer struct {
	cfg     *Config
	metrics *metrics
	board   *board
	// noMaterial says why a snapshot holds no signing certificate
	// (manager.noMaterial): only on that refusal does signing ask the
	// manager anything.
	noMaterial func() error

	// localRoots is the X.509 bundle GetX509BundleForTrustDomain last
	// derived from the published bundle.
	localRoots atomic.Pointer[localBundle]
}

// signSVID is Authority.SignX509SVID.
func (s *signer) signSVID(p X509SVIDParams) (*Issued, error) {
	return s.signWith(func(now time.Time, mat SigningMaterial, pol Policy) (*Issued, error) {
		return signX509SVID(now, mat, pol, p)
	})
}

// signWith runs sign with the published signing material and policy and
// the time board.read gives (a leaf never outlives the RemoveAfter a
// retirement computed for its root), and counts the result.
func (s *signer) signWith(sign func(now time.Time, mat SigningMaterial, p Policy) (*Issued, error)) (*Issued, error) {
	start := time.Now()
	defer func() { s.metrics.signingTime.Observe(time.Since(start).Seconds()) }()
	snap, now := s.board.read(s.cfg.Clock)
	mat, err := s.material(snap)
	if err != nil {
		s.metrics.signings.WithLabelValues("signing_material").Inc()
		return nil, err
	}
	issued, err := sign(now, mat, snap.policy)
	if err != nil {
		s.metrics.signings.WithLabelValues(signResult(err)).Inc()
		return nil, err
	}
	s.metrics.signings.WithLabelValues("ok").Inc()
	return issued, nil
}

// material is snap's signing material, or why there is none.
func (s *signer) material(snap *signingSnapshot) (SigningMaterial, error) {
	if snap.material.Cert == nil {
		return snap.material, s.noMaterial()
	}
	return snap.material, nil
}

// noSigningCert is why the published snapshot holds no signing
// certificate, nil when it holds one: a state the CA leaves by itself
// (an upstream signs the first intermediate, the leader writes the
// state), which serving certificates wait out.
func (s *signer) noSigningCert() error {
	if s.board.load().material.Cert != nil {
		return nil
	}
	return s.noMaterial()
}

// bundle is Authority.Bundle.
func (s *signer) bundle() *spiffebundle.Bundle { return s.board.load().bundle }

func signResult(err error) string {
	if kind := SignErrorKind(err); kind != "" {
		return kind
	}
	return "error"
}

// SignErrorKind returns the stable label of a signing error, for metric
// labels and logs: "invalid_csr", "identity_not_allowed", "invalid_ttl",
// "signing_material", or "" for any other error (a server fault, which
// each caller names itself).
func SignErrorKind(err error) string {
	switch {
	case errors.Is(err, ErrInvalidCSR):
		return "invalid_csr"
	case errors.Is(err, ErrIdentityNotAllowed):
		return "identity_not_allowed"
	case errors.Is(err, ErrInvalidTTL):
		return "invalid_ttl"
	case errors.Is(err, ErrInvalidSigningMaterial):
		return "signing_material"
	default:
		return ""
	}
}
