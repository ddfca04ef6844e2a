package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap/mapcrd"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server/admin"
	"github.com/trustbridge/trustbridge/internal/server/nodeauth"
)

// IdentityMapConfig are the identity map's flags: the rules node agents
// map their workloads with, which the node authorizer checks their
// requests against.
type IdentityMapConfig struct {
	File    string
	Default string
	Poll    time.Duration
}

func addIdentityMapFlags(f *pflag.FlagSet, o *IdentityMapConfig) {
	f.StringVar(&o.File, "identity-map", "", "identity map file (YAML: default, rules; docs/identity-map.md), the rules node agents (trustbridge agent --node --identity-map) map attested workloads to SPIFFE IDs with: "+
		"a node agent is then granted (ImpersonatedIdentity) exactly the ID the map gives a running pod on its node, from the pod's namespace, service account, name, UID, labels and node, "+
		"instead of only spiffe://<td>/ns/<namespace>/sa/<service account>; rules that select by unix facts or use the container or the caller's uid in templates are never granted (the server cannot check them). "+
		"Polled and reloaded on change and on SIGHUP, a bad change keeps the last good rules. Needs --ca-trusted-node-accounts and Kubernetes to grant anything")
	f.StringVar(&o.Default, "identity-map-default", string(identitymap.DefaultIstio), "with an identity map: what a pod no rule selects may get: istio (spiffe://<td>/ns/<namespace>/sa/<service account>) or none (nothing); none in the file wins")
	f.DurationVar(&o.Poll, "identity-map-poll-interval", identitymap.DefaultFilePollInterval, "how often --identity-map is checked for changes")
}

// errIdentityMapCRDStorage refuses --identity-map-crd without Kubernetes.
var errIdentityMapCRDStorage = errors.New("--identity-map-crd needs --storage kube: the resources are read from the API server, and the leader writes their status")

// identityMapSetup is the server's identity map: the Cell the node
// authorizer reads, the Combiner of its sources (--identity-map,
// ClusterIdentityMapping resources) and their runners. Nil without an
// identity map: the node authorizer grants the Istio form only.
type identityMapSetup struct {
	cell     *identitymap.Cell
	combiner *identitymap.Combiner
	file     *identitymap.FileSource // nil without --identity-map
	ctl      *mapcrd.Controller      // nil without --identity-map-crd
}

// setupIdentityMap builds the identity map from --identity-map and, with
// --identity-map-crd, the resources; nil when neither is set. A bad file
// at start is an error naming the line and rule.
func setupIdentityMap(o Config, td spiffeid.TrustDomain, kube *kubeSetup, reg prometheus.Registerer, logger *slog.Logger) (*identityMapSetup, error) {
	crd := o.Kube.IdentityMapCRD && kube != nil
	if o.IdentityMap.File == "" && !crd {
		return nil, nil
	}
	def, err := identitymap.ParseDefault(cmp.Or(o.IdentityMap.Default, string(identitymap.DefaultIstio)))
	if err != nil {
		return nil, fmt.Errorf("--identity-map-default: %w", err)
	}
	logger = logger.With(logattr.Component, "identity-map")
	cfg := identitymap.Config{TrustDomain: td, Default: def, MaxTTL: o.MaxWorkloadTTL}
	s := &identityMapSetup{cell: identitymap.NewCell(nil)}
	if s.combiner, err = identitymap.NewCombiner(cfg, s.cell, identitymap.WithRegisterer(reg)); err != nil {
		return nil, fmt.Errorf("identity map: %w", err)
	}
	if o.IdentityMap.File != "" {
		s.file = identitymap.NewFileSource(o.IdentityMap.File, s.combiner, logger, cmp.Or(o.IdentityMap.Poll, identitymap.DefaultFilePollInterval))
		if err := s.file.Load(); err != nil {
			return nil, fmt.Errorf("--identity-map: %w", err)
		}
	}
	if crd {
		s.ctl, err = mapcrd.New(mapcrd.Config{
			Dynamic: kube.dynamic, Events: kube.client, Map: cfg,
			Apply: mapcrd.CombinerApplier(s.combiner), Current: s.combiner.Map, IsLeader: kube.elector.IsLeader,
			Logger: logger.With(logattr.Component, "identity-map-crd"), Registerer: reg,
		})
		if err != nil {
			return nil, fmt.Errorf("identity map: %w", err)
		}
	}
	s.announce(logger, crd)
	return s, nil
}

// announce says which identity map the server starts with, and warns of
// what in it cannot work.
func (s *identityMapSetup) announce(logger *slog.Logger, crd bool) {
	m := s.combiner.Map()
	logger.Info("identity map in force: node agents are granted the IDs it gives the pods on their node",
		"rules", len(m.Rules()), "default", string(m.Default()), "crd", crd)
	for _, a := range m.AgentOnly() {
		logger.Warn("identity map rule only node agents can evaluate: the server never grants its IDs", logattr.Rule, a.Name, logattr.Warning, a.Message)
	}
	if cs := m.Conflicts(); len(cs) > 0 {
		logger.Warn("identity map rules conflict: workloads they both select get no identity",
			"conflicts", len(cs), logattr.Rule, cs[0].First.Name, logattr.Warning, cs[0].Message)
	}
}

// source is what the node authorizer reads; nil without a map.
func (s *identityMapSetup) source() nodeauth.MapSource {
	if s == nil {
		return nil
	}
	return s.cell
}

// ready reports whether the resources were read, so that no node agent is
// granted an identity decided on part of the rules; nil without them.
func (s *identityMapSetup) ready() func() bool {
	if s == nil || s.ctl == nil {
		return nil
	}
	synced := s.ctl.Synced()
	return func() bool {
		select {
		case <-synced:
			return true
		default:
			return false
		}
	}
}

// runners polls --identity-map and watches the resources.
func (s *identityMapSetup) runners() []func(context.Context) error {
	if s == nil {
		return nil
	}
	var rs []func(context.Context) error
	if s.file != nil {
		rs = append(rs, s.file.Run)
	}
	if s.ctl != nil {
		rs = append(rs, s.ctl.Run, func(ctx context.Context) error {
			return s.ctl.WatchSync(ctx, mapcrd.DefaultSyncWarn, "node agents are refused as unavailable until they are")
		})
	}
	return rs
}

// adminConfig is the identity map as the admin API shows and explains it.
func (s *identityMapSetup) adminConfig() *admin.IdentityMapConfig {
	if s == nil {
		return nil
	}
	return &admin.IdentityMapConfig{Map: s.combiner.Map, Statuses: s.combiner.Statuses}
}
