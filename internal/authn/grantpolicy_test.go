package authn

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestGrantPolicy(t *testing.T) {
	const maxLifetime = 30 * 24 * time.Hour
	boot := Grant{Method: MethodBootstrapToken, Ref: bootstrapRef(tokLaptop), GrantedAt: grantTime}
	kube := Grant{Method: MethodKubernetesJWT, Ref: "default/web", UID: "uid", GrantedAt: grantTime}
	legacy := Grant{Method: GrantMethodLegacy, GrantedAt: grantTime}
	sdsMinted := Grant{Method: GrantMethodSDS, GrantedAt: grantTime}
	answer := func(err error) GrantChecker {
		return GrantCheckerFunc(func(context.Context, spiffeid.ID, Grant) error { return err })
	}
	svid := func(g *Grant) Identity { return Identity{ID: workloadID, Method: MethodX509SVID, Grant: g} }
	faulty := errors.New("checker bug")

	tests := []struct {
		name     string
		ident    Identity
		checkers map[string]GrantChecker
		age      time.Duration
		want     *Grant
		wantErr  error
	}{
		{name: "first grant by token passes", ident: Identity{ID: laptopID, Method: MethodBootstrapToken, Grant: &Grant{Method: MethodBootstrapToken, Ref: boot.Ref}}, want: &Grant{Method: MethodBootstrapToken, Ref: boot.Ref}},
		{name: "token method without a grant", ident: Identity{ID: laptopID, Method: "fake"}},
		{name: "grant stands", ident: svid(&boot), checkers: map[string]GrantChecker{MethodBootstrapToken: answer(nil)}, want: &boot},
		{name: "at the maximum lifetime", ident: svid(&boot), checkers: map[string]GrantChecker{MethodBootstrapToken: answer(nil)}, age: maxLifetime, want: &boot},
		{name: "past the maximum lifetime", ident: svid(&boot), checkers: map[string]GrantChecker{MethodBootstrapToken: answer(nil)}, age: maxLifetime + time.Second, want: &boot, wantErr: ErrGrantExpired},
		{name: "revoked", ident: svid(&kube), checkers: map[string]GrantChecker{MethodKubernetesJWT: answer(ErrGrantRevoked)}, want: &kube, wantErr: ErrGrantRevoked},
		{name: "cannot tell", ident: svid(&kube), checkers: map[string]GrantChecker{MethodKubernetesJWT: answer(ErrUnavailable)}, want: &kube, wantErr: ErrUnavailable},
		{name: "checker fault", ident: svid(&kube), checkers: map[string]GrantChecker{MethodKubernetesJWT: answer(faulty)}, want: &kube, wantErr: faulty},
		{name: "no checker for the method", ident: svid(&kube), checkers: map[string]GrantChecker{MethodBootstrapToken: answer(nil)}, want: &kube, wantErr: ErrGrantRevoked},
		{name: "legacy passes unchecked", ident: svid(&legacy), want: &legacy},
		{name: "minted by SDS is no credential", ident: svid(&sdsMinted), want: &sdsMinted, wantErr: ErrGrantRevoked},
		{name: "legacy past the maximum lifetime", ident: svid(&legacy), age: maxLifetime + time.Second, want: &legacy, wantErr: ErrGrantExpired},
		{name: "unreadable grant", ident: Identity{ID: workloadID, Method: MethodX509SVID, GrantErr: errors.New("bad DER")}, wantErr: ErrGrantUnreadable},
		{name: "no grant reported", ident: Identity{ID: workloadID, Method: MethodX509SVID}, wantErr: ErrGrantUnreadable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakePassiveClock(grantTime.Add(tt.age))
			p := &GrantPolicy{Checkers: tt.checkers, MaxLifetime: maxLifetime, Clock: clk}
			got, err := p.Check(context.Background(), tt.ident)
			assert.Equal(t, tt.want, got)
			if tt.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.wantErr)

			// The same policy in front of an authenticator.
			auth := RequireGrant(AuthenticatorFunc(func(context.Context, Request) (Identity, error) { return tt.ident, nil }), p)
			id, err := auth.Authenticate(context.Background(), Request{})
			assert.Zero(t, id)
			if errors.Is(tt.wantErr, ErrUnavailable) {
				require.ErrorIs(t, err, ErrUnavailable, "a retry may succeed")
				assert.NotErrorIs(t, err, ErrInvalidCredentials)
			} else {
				require.ErrorIs(t, err, ErrInvalidCredentials)
			}
			assert.Contains(t, err.Error(), "authn: x509-svid: ")
		})
	}
}

func TestRequireGrantPassesThrough(t *testing.T) {
	p := &GrantPolicy{} // no checkers: every checked grant would be revoked
	tests := []struct {
		name  string
		ident Identity
		err   error
	}{
		{name: "token identity", ident: Identity{ID: laptopID, Method: MethodBootstrapToken, Grant: &Grant{Method: MethodBootstrapToken, Ref: bootstrapRef(tokLaptop)}}},
		{name: "authentication error", err: ErrInvalidCredentials},
		{name: "legacy SVID", ident: Identity{ID: workloadID, Method: MethodX509SVID, Grant: &Grant{Method: GrantMethodLegacy, GrantedAt: grantTime}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			auth := RequireGrant(AuthenticatorFunc(func(context.Context, Request) (Identity, error) { return tt.ident, tt.err }), p)
			id, err := auth.Authenticate(context.Background(), Request{})
			assert.Equal(t, tt.ident, id)
			assert.Equal(t, tt.err, err)
		})
	}
}
