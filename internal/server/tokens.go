package server

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// bootstrapTokens loads --bootstrap-token-file with the ledger that
// records which single-use tokens were consumed.
func bootstrapTokens(o GRPCConfig, td spiffeid.TrustDomain, reg prometheus.Registerer, logger *slog.Logger) (*authn.BootstrapTokens, error) {
	if o.tokenLedger == nil {
		return nil, errors.New("--bootstrap-token-file: no consumed-token ledger configured")
	}
	ledger, err := o.tokenLedger()
	if err != nil {
		return nil, fmt.Errorf("--bootstrap-token-file: %w", err)
	}
	boot, err := authn.NewBootstrapTokens(authn.BootstrapTokensConfig{
		Path: o.BootstrapFile, TrustDomain: td, Ledger: ledger,
		ReloadInterval: o.BootstrapReload, OnReload: o.OnBootstrapReload,
		Logger: logger.With(logattr.Component, "bootstrap-tokens"), Registerer: reg,
	})
	if err != nil {
		return nil, fmt.Errorf("--bootstrap-token-file: %w", err)
	}
	logger.Warn("bootstrap tokens accepted: a token is a shared secret that proves nothing about the machine holding it; it buys a first certificate, which then renews itself (trustbridge ca request --renew, trustbridge agent). Tokens are single-use unless their line says reusable",
		"path", o.BootstrapFile, "tokens", boot.Len(), "consumed_ledger", describeLedger(ledger))
	return boot, nil
}

// describeLedger names where consumed tokens are recorded, for the log.
func describeLedger(l authn.TokenLedger) string {
	switch l := l.(type) {
	case *authn.FileLedger:
		return l.Path()
	case *authn.KubeLedger:
		return l.Describe()
	}
	return "memory"
}

// tokenLedger is where single-use bootstrap tokens are recorded as
// consumed: the data directory, or the --bootstrap-token-secret Secret
// with --storage kube so that every replica refuses a token any of them
// consumed. Opened only when --bootstrap-token-file is set.
func (k *kubeSetup) tokenLedger(dataDir string) func() (authn.TokenLedger, error) {
	if k == nil {
		return func() (authn.TokenLedger, error) {
			return authn.OpenFileLedger(filepath.Join(dataDir, authn.LedgerFileName))
		}
	}
	return func() (authn.TokenLedger, error) {
		return authn.NewKubeLedger(authn.KubeLedgerConfig{Client: k.client, Namespace: k.namespace, Name: k.o.tokenSecret})
	}
}

// reloadTokens re-reads --bootstrap-token-file for the admin API (nil
// without a gRPC service or a token file): trustbridge token revoke takes
// effect at once rather than at the next poll.
func (g *grpcEndpoint) reloadTokens() func() (api.TokenReload, error) {
	if g == nil || g.tokens == nil {
		return nil
	}
	tokens := g.tokens
	return func() (api.TokenReload, error) {
		r, err := tokens.ReloadCounted()
		if err != nil {
			return api.TokenReload{}, fmt.Errorf("--bootstrap-token-file: %w", err)
		}
		return api.TokenReload{Tokens: r.Tokens, Added: r.Added, Removed: r.Removed}, nil
	}
}
