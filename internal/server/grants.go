package server

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// addGrantFlags adds the flags that bound renewal chains.
func addGrantFlags(f *pflag.FlagSet, o *GRPCConfig) {
	f.DurationVar(&o.MaxRenewalLifetime, "max-renewal-lifetime", 0,
		"longest a chain of renewals by X509-SVID may run from the bootstrap or service account token that first granted it, "+
			"e.g. 720h: older chains are refused and the caller must present such a token again; 0 for no bound. "+
			"Independently of it, a renewal is always refused once the bootstrap token that granted the chain is removed from "+
			"--bootstrap-token-file, or its service account is deleted or re-created (needs get, list and watch on serviceaccounts). "+
			"Certificates issued before grants were recorded, or by `ca issue`, renew with a warning and only this bound ends them")
}

// checkGrantFlags refuses values the certificate service would refuse,
// naming the flag.
func checkGrantFlags(o GRPCConfig) error {
	if o.MaxRenewalLifetime < 0 {
		return fmt.Errorf("--max-renewal-lifetime %s is negative; 0 means no bound", o.MaxRenewalLifetime)
	}
	return nil
}

// grantCheckers records, by grant method, what decides whether the grant
// behind a renewal still stands; setupGRPC hands it to the certificate
// service. A method without a checker (bootstrap tokens not configured,
// no Kubernetes) has its renewals refused: the server no longer accepts
// that kind of credential.
type grantCheckers map[string]authn.GrantChecker

// addBootstrapGrants lets the token file decide bootstrap grants.
func (g *grpcEndpoint) addBootstrapGrants(boot *authn.BootstrapTokens) {
	g.grantMap()[authn.MethodBootstrapToken] = boot
}

// addServiceAccountGrants checks Kubernetes grants against the service
// accounts the API server lists, and runs their informer with the server.
func (g *grpcEndpoint) addServiceAccountGrants(client kubernetes.Interface, onDelete func(namespace, name string), logger *slog.Logger) error {
	sa, err := authn.NewServiceAccountGrants(authn.ServiceAccountGrantsConfig{
		Client: client, OnDelete: onDelete, Logger: logger.With(logattr.Component, "service-account-grants"),
	})
	if err != nil {
		return err
	}
	g.grantMap()[authn.MethodKubernetesJWT] = sa
	g.runners = append(g.runners, sa.Run)
	return nil
}

// GrantHooks are test hooks of grpcOptions, no flags: a test waits on
// them instead of sleeping.
type GrantHooks struct {
	// BootstrapReload is how often the bootstrap token file is re-read (0
	// = authn's default); onBootstrapReload is called after every reload.
	BootstrapReload   time.Duration
	OnBootstrapReload func(changed bool, err error)
	// OnServiceAccountDeleted is called once the server's informer has seen
	// a service account deleted.
	OnServiceAccountDeleted func(namespace, name string)
	// OnGRPCServices is called with every service the certificate
	// service's listener serves, once they are registered, so that a test
	// can hold each of their RPCs to the grant checks.
	OnGRPCServices func(map[string]grpc.ServiceInfo)
}

// reportServices calls onGRPCServices, when set, with the services r
// serves; r is the listener's *grpc.Server, once every service has
// registered.
func (h GrantHooks) reportServices(r grpc.ServiceRegistrar) {
	gs, ok := r.(interface {
		GetServiceInfo() map[string]grpc.ServiceInfo
	})
	if ok && h.OnGRPCServices != nil {
		h.OnGRPCServices(gs.GetServiceInfo())
	}
}

// sdsAuthenticator applies the certificate service's grant policy to SDS
// callers proved by an X509-SVID: SDS mints certificates too, so a chain
// the certificate service refuses to renew must not get them from SDS.
// For the same reason it refuses single-use bootstrap tokens.
func (g *grpcEndpoint) sdsAuthenticator(auth authn.Authenticator, o GRPCConfig) authn.Authenticator {
	// A single-use bootstrap token buys one certificate from the
	// certificate service; an SDS stream would mint with it for as long
	// as it lasts.
	return authn.ReusableOnly(authn.RequireGrant(auth, &authn.GrantPolicy{Checkers: g.grants, MaxLifetime: o.MaxRenewalLifetime}))
}

func (g *grpcEndpoint) grantMap() grantCheckers {
	if g.grants == nil {
		g.grants = grantCheckers{}
	}
	return g.grants
}
