package ca

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/trustbridge/trustbridge/ca/castate"
)

// signSVID is Authority.SignX509SVID.
func (m *manager) signSVID(p X509SVIDParams) (*Issued, error) {
	return m.signLocked(func(now time.Time, m SigningMaterial, pol Policy) (*Issued, error) {
		return signX509SVID(now, m, pol, p)
	})
}

// signLocked runs sign with the signing material, policy and time, and
// counts the result. Signing under the read lock, with the time taken
// under it, orders every signing before or after a retirement: a leaf
// never outlives the RemoveAfter computed for its root.
func (m *manager) signLocked(sign func(now time.Time, m SigningMaterial, p Policy) (*Issued, error)) (*Issued, error) {
	start := time.Now()
	defer func() { m.metrics.signingTime.Observe(time.Since(start).Seconds()) }()
	m.mu.RLock()
	defer m.mu.RUnlock()
	mat, err := m.signingMaterialLocked()
	if err != nil {
		m.metrics.signings.WithLabelValues("signing_material").Inc()
		return nil, err
	}
	issued, err := sign(m.cfg.Clock.Now(), mat, m.policy())
	if err != nil {
		m.metrics.signings.WithLabelValues(signResult(err)).Inc()
		return nil, err
	}
	m.metrics.signings.WithLabelValues("ok").Inc()
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
func (m *manager) policy() Policy {
	return Policy{
		TrustDomain: m.cfg.TrustDomain, DefaultTTL: m.cfg.WorkloadTTL, MaxTTL: m.cfg.MaxWorkloadTTL,
		ClampTTL: recordedTTL(m.journal.MaxWorkloadTTLSeconds),
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

func (m *manager) signingMaterialLocked() (SigningMaterial, error) {
	if m.cfg.Plugin != nil {
		p := m.plugin
		if p == nil {
			return SigningMaterial{}, errors.New("ca: no plug-in CA material published")
		}
		return SigningMaterial{Cert: p.Cert, Key: p.Key, Intermediates: p.Intermediates, Roots: p.Roots}, nil
	}
	mat := RootsMaterial(m.roots)
	if mat.Cert == nil {
		if len(m.roots) == 0 && !m.leading() {
			return mat, fmt.Errorf("ca: %w: no CA state in %s yet; the leader creates it", ErrInvalidSigningMaterial, m.backend.Describe())
		}
		if m.cfg.Upstream != nil && m.up.lastErr != nil {
			// At a first start the upstream's refusal is the reason: a
			// serving certificate that cannot be made says why.
			return mat, fmt.Errorf("ca: %w: no intermediate yet; the upstream's last answer failed: %v", ErrInvalidSigningMaterial, m.up.lastErr)
		}
		return mat, fmt.Errorf("ca: %w: no active root", ErrInvalidSigningMaterial)
	}
	return mat, nil
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
