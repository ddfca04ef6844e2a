package ca

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// SignX509SVID signs an X509-SVID for p.PublicKey and p.SPIFFEID, the
// identity the caller proved, with the active root or intermediate: the
// one entry point of every workload leaf (SDS, the certificate service,
// whose edge parses and judges the CSR it receives). The key's strength,
// the identity, the TTL against Config.MaxWorkloadTTL, the DNS names and
// the extensions are checked as the package-level SignX509SVID does.
func (a *Authority) SignX509SVID(p X509SVIDParams) (*Issued, error) {
	return a.signLocked(func(now time.Time, m SigningMaterial, pol Policy) (*Issued, error) {
		return signX509SVID(now, m, pol, p)
	})
}

// signLocked runs sign with the signing material, policy and time, and
// counts the result. Signing under the read lock, with the time taken
// under it, orders every signing before or after a retirement: a leaf
// never outlives the RemoveAfter computed for its root.
func (a *Authority) signLocked(sign func(now time.Time, m SigningMaterial, p Policy) (*Issued, error)) (*Issued, error) {
	start := time.Now()
	defer func() { a.metrics.signingTime.Observe(time.Since(start).Seconds()) }()
	a.mu.RLock()
	defer a.mu.RUnlock()
	m, err := a.signingMaterialLocked()
	if err != nil {
		a.metrics.signings.WithLabelValues("signing_material").Inc()
		return nil, err
	}
	issued, err := sign(a.cfg.Clock.Now(), m, a.policy())
	if err != nil {
		a.metrics.signings.WithLabelValues(signResult(err)).Inc()
		return nil, err
	}
	a.metrics.signings.WithLabelValues("ok").Inc()
	return issued, nil
}

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

// policy is the leaf policy; call it under mu. Requests are refused only
// over the configured maximum; the journal's recorded maximum, when
// shorter, only clamps a leaf's lifetime. The leader removes a retired root
// once the recorded maximum has passed, so a replica configured with a
// higher maximum than the leader's must not sign leaves that outlive their
// root in the bundle; but refusing would fail a rollout that raises the
// maximum, whose new pods follow the old leader until they lead and raise
// the record themselves.
func (a *Authority) policy() Policy {
	return Policy{
		TrustDomain: a.cfg.TrustDomain, DefaultTTL: a.cfg.WorkloadTTL, MaxTTL: a.cfg.MaxWorkloadTTL,
		ClampTTL: recordedTTL(a.journal.MaxWorkloadTTLSeconds),
	}
}

// recordedTTL is a journal's recorded maximum as a clamp: zero (none) when
// it is not positive, and no shorter than it is when it would overflow a
// Duration, so a damaged journal never turns into a negative policy.
func recordedTTL(seconds int64) time.Duration {
	switch {
	case seconds <= 0:
		return 0
	case seconds > math.MaxInt64/int64(time.Second):
		return math.MaxInt64
	default:
		return time.Duration(seconds) * time.Second
	}
}

func (a *Authority) signingMaterialLocked() (SigningMaterial, error) {
	if a.cfg.Plugin != nil {
		p := a.plugin
		if p == nil {
			return SigningMaterial{}, errors.New("ca: no plug-in CA material published")
		}
		return SigningMaterial{Cert: p.Cert, Key: p.Key, Intermediates: p.Intermediates, Roots: p.Roots}, nil
	}
	m := RootsMaterial(a.roots)
	if m.Cert == nil {
		if len(a.roots) == 0 && !a.leading() {
			return m, fmt.Errorf("ca: %w: no CA state in %s yet; the leader creates it", ErrInvalidSigningMaterial, a.backend.Describe())
		}
		if a.cfg.Upstream != nil && a.up.lastErr != nil {
			// At a first start the upstream's refusal is the reason: a
			// serving certificate that cannot be made says why.
			return m, fmt.Errorf("ca: %w: no intermediate yet; the upstream's last answer failed: %v", ErrInvalidSigningMaterial, a.up.lastErr)
		}
		return m, fmt.Errorf("ca: %w: no active root", ErrInvalidSigningMaterial)
	}
	return m, nil
}

// RootsMaterial is the signing material of loaded roots (Store.Load): the
// active root or upstream intermediate signs (Cert is nil when none is
// active), with the upstream's intermediates above it, and Roots are every
// published root: the self-signed roots, or in upstream mode the upstream
// roots of every intermediate kept, never an intermediate itself.
func RootsMaterial(roots []*castate.Root) SigningMaterial {
	var m SigningMaterial
	for _, r := range roots {
		for _, c := range r.Published() {
			// A handful of roots: comparing bytes beats hashing them on
			// every signing.
			if !slices.ContainsFunc(m.Roots, c.Equal) {
				m.Roots = append(m.Roots, c)
			}
		}
		if r.State == castate.StateActive {
			m.Cert, m.Key, m.Intermediates = r.Cert, r.Key, r.UpstreamChain
		}
	}
	return m
}
