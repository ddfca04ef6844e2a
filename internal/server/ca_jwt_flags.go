package server

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
)

// JWTKeyConfig are the flags of the CA's JWT-SVID signing keys.
type JWTKeyConfig struct {
	keyType    string
	keyTTL     time.Duration
	svidTTL    time.Duration
	maxSVIDTTL time.Duration
	// Issuer is --jwt-issuer: the iss of every JWT-SVID, and the OIDC
	// issuer the bundle endpoint serves (oidc_discovery.go).
	Issuer string
}

func addJWTKeyFlags(f *pflag.FlagSet, o *JWTKeyConfig) {
	f.StringVar(&o.keyType, "jwt-key-type", string(ca.DefaultConfig().JWTKeyType), "algorithm of new JWT-SVID signing keys: ES256, ES384, RS256 (RSA 3072)")
	f.DurationVar(&o.keyTTL, "jwt-key-ttl", ca.DefaultConfig().JWTKeyTTL, "lifetime of new JWT-SVID signing keys; a successor is published at half of it and signs 5 refresh hints later; half of it must cover 5 refresh hints plus --max-jwt-svid-ttl")
	f.DurationVar(&o.svidTTL, "jwt-svid-ttl", 0, "lifetime of a JWT-SVID asked for without one (default 5m, or --max-jwt-svid-ttl if lower)")
	f.StringVar(&o.Issuer, "jwt-issuer", "", "OIDC issuer URL (https://HOST[/PATH], no trailing slash) set as iss in every JWT-SVID; with --bundle-profile https_web the bundle endpoint serves its discovery document and JWKS "+
		"at URL/.well-known/openid-configuration and URL/keys, so AWS, GCP, Azure and Vault accept the tokens (docs/oidc-discovery.md). The certificate must cover HOST")
	f.DurationVar(&o.maxSVIDTTL, "max-jwt-svid-ttl", ca.DefaultConfig().MaxJWTSVIDTTL, "longest lifetime of a JWT-SVID; longer requests are cut to it, and a retired signing key stays published this long (the largest ever used)")
}

// check finds what ca.New would refuse, named by flag. Zero values take
// the ca package's defaults.
func (o JWTKeyConfig) check() error {
	if o.keyType != "" {
		if _, err := ca.ParseJWTKeyType(o.keyType); err != nil {
			return fmt.Errorf("--jwt-key-type: %w", err)
		}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"jwt-key-ttl", o.keyTTL}, {"jwt-svid-ttl", o.svidTTL}, {"max-jwt-svid-ttl", o.maxSVIDTTL}} {
		if d.v < 0 {
			return fmt.Errorf("--%s %s is negative; give a positive duration such as 5m", d.flag, d.v)
		}
	}
	if o.Issuer != "" {
		if _, err := jwtsvid.ParseIssuer(o.Issuer); err != nil {
			return fmt.Errorf("--jwt-issuer: %w", err)
		}
	}
	if o.maxSVIDTTL > 0 && o.svidTTL > o.maxSVIDTTL {
		return fmt.Errorf("--jwt-svid-ttl %s exceeds --max-jwt-svid-ttl %s; lower the one or raise the other", o.svidTTL, o.maxSVIDTTL)
	}
	return nil
}

// apply sets the JWT fields of c, after check.
func (o JWTKeyConfig) apply(c *ca.Config) error {
	if err := o.check(); err != nil {
		return err
	}
	c.JWTKeyType = ca.JWTKeyType(o.keyType)
	c.JWTKeyTTL, c.JWTSVIDTTL, c.MaxJWTSVIDTTL = o.keyTTL, o.svidTTL, o.maxSVIDTTL
	c.JWTIssuer = o.Issuer
	return nil
}
