package server

import (
	"fmt"

	"github.com/spf13/pflag"
	"golang.org/x/time/rate"

	"github.com/trustbridge/trustbridge/internal/authn"
)

// authnLimits bound the work an unauthenticated caller can cause on the
// certificate service/SDS listener (issue 14): client certificate
// verifications in flight, TokenReviews per client address, and whether a
// token's signature is checked against the issuer's keys first. Zero
// values mean the authn package's defaults.
type authnLimits struct {
	verifyPerPeer   int
	verifyMax       int
	reviewPerPeer   int
	reviewPeerRate  float64
	reviewPeerBurst int
	noIssuerKeys    bool
}

func addAuthnLimitFlags(f *pflag.FlagSet, o *authnLimits) {
	f.IntVar(&o.verifyPerPeer, "client-cert-verify-per-peer", authn.DefaultMaxVerificationsPerPeer,
		"client certificate chains verified at once for one client address (an IPv4 or IPv6 address) before it has proved anything, e.g. 4; "+
			"more are refused with Unavailable for the client to retry. Chains verified before (cached) never wait")
	f.IntVar(&o.verifyMax, "client-cert-verify-max", authn.DefaultMaxVerifications,
		"client certificate chains verified at once in total, e.g. 32 (see --client-cert-verify-per-peer)")
	f.IntVar(&o.reviewPerPeer, "token-review-per-peer", authn.DefaultMaxReviewsPerPeer,
		"TokenReviews in flight for one client address, e.g. 8 of the 64 in total; more are refused with Unavailable for the client to retry")
	f.Float64Var(&o.reviewPeerRate, "token-review-peer-rate", authn.DefaultPeerReviewRate,
		"new (uncached) TokenReviews one client address may cause per second, e.g. 5; a pod renews with one token a few times a day")
	f.IntVar(&o.reviewPeerBurst, "token-review-peer-burst", authn.DefaultPeerReviewBurst,
		"burst of --token-review-peer-rate, e.g. 20 (a node whose pods all start at once)")
	f.Var(newInvertedBool(&o.noIssuerKeys), "token-issuer-keys",
		"check a service account token's signature against the API server's service account issuer keys "+
			"(GET /.well-known/openid-configuration and its jwks_uri, allowed to every service account by the default ClusterRoleBinding "+
			"system:service-account-issuer-discovery) before spending a TokenReview on it; when discovery is refused or absent, "+
			"TokenReview alone decides (logged once), e.g. --token-issuer-keys=false to never ask")
}

// check refuses values the authenticators would refuse, naming the flag.
func (o authnLimits) check() error {
	// !(x >= 0) also refuses NaN, which a limiter treats as no limit.
	if o.verifyPerPeer < 1 || o.verifyMax < 1 || o.reviewPerPeer < 1 || !(o.reviewPeerRate > 0) || o.reviewPeerBurst < 1 {
		return fmt.Errorf("--client-cert-verify-per-peer (%d), --client-cert-verify-max (%d), --token-review-per-peer (%d), "+
			"--token-review-peer-rate (%v) and --token-review-peer-burst (%d) must be positive",
			o.verifyPerPeer, o.verifyMax, o.reviewPerPeer, o.reviewPeerRate, o.reviewPeerBurst)
	}
	return nil
}

// withDefaults maps the zero value (options built without flags, in tests)
// to the package default.
func (o authnLimits) withDefaults() authnLimits {
	if o.verifyPerPeer == 0 {
		o.verifyPerPeer = authn.DefaultMaxVerificationsPerPeer
	}
	if o.verifyMax == 0 {
		o.verifyMax = authn.DefaultMaxVerifications
	}
	if o.reviewPerPeer == 0 {
		o.reviewPerPeer = authn.DefaultMaxReviewsPerPeer
	}
	if o.reviewPeerRate == 0 {
		o.reviewPeerRate = authn.DefaultPeerReviewRate
	}
	if o.reviewPeerBurst == 0 {
		o.reviewPeerBurst = authn.DefaultPeerReviewBurst
	}
	return o
}

func (o authnLimits) peerRate() rate.Limit { return rate.Limit(o.reviewPeerRate) }
