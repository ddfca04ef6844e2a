package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap/mapcrd"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server"
	sdsagent "github.com/trustbridge/trustbridge/sds/agent"
	"github.com/trustbridge/trustbridge/sds/attest"
	"github.com/trustbridge/trustbridge/sds/broker"
)

// NodeConfig is trustbridge agent --node's part of Config: the agent
// serves every workload of its node its own attested identity.
type NodeConfig struct {
	Enabled bool
	// Name is this node's name (--node-name, NODE_NAME).
	Name string
	// IdentityMap is the identity map file; "" for the default alone.
	IdentityMap string
	// IdentityDefault is what workloads no rule selects get: istio or
	// none.
	IdentityDefault string
	// IdentityMapCRD adds the rules of ClusterIdentityMapping resources,
	// read from the API server, to the identity map: the same rules the
	// server checks the agent's requests against.
	IdentityMapCRD bool
	// Kubeconfig reads pods from that API server; "" in a pod reads them
	// from the in-cluster one, and elsewhere attests unix facts only.
	Kubeconfig string
	// ProcRoot is where the host's /proc is mounted.
	ProcRoot string
	// AttestBinary adds each caller's binary path and SHA-256.
	AttestBinary  bool
	MaxIdentities int
	// BrokerSocket, when set, serves brokers on it (--broker-socket),
	// which BrokerAllow may use; BrokerSocketGroup may also connect.
	BrokerSocket      string
	BrokerSocketGroup string
	BrokerAllow       []string
}

// nodeFlag names the flag of node mode, for errors.
const nodeFlag = "--node"

// nodeConfig builds the node agent's attestor, pod informer and identity
// map for trust domain td. It reads the identity map file (a bad one
// fails here, before anything is served) but contacts nothing.
func (o Config) nodeConfig(base *slog.Logger, reg prometheus.Registerer, td spiffeid.TrustDomain) (*sdsagent.NodeConfig, error) {
	n := o.Node
	switch {
	case o.TokenFile == "":
		return nil, fmt.Errorf("%s needs --token-file, the agent's projected service account token: the server lets a node agent ask for the certificates of its node's pods only on that token", nodeFlag)
	case n.MaxIdentities < 0:
		return nil, fmt.Errorf("--max-identities %d must not be negative", n.MaxIdentities)
	}
	def, err := identitymap.ParseDefault(n.IdentityDefault)
	if err != nil {
		return nil, fmt.Errorf("--identity-default: %w", err)
	}
	logger := base.With(logattr.Component, "attestor")
	nc := &sdsagent.NodeConfig{NodeName: n.Name, MaxIdentities: n.MaxIdentities, TTL: o.TTL}
	if nc.Broker, err = n.broker(); err != nil {
		return nil, err
	}
	acfg := attest.Config{ProcRoot: n.ProcRoot, Binary: n.AttestBinary, Logger: logger, Registerer: reg}
	kcfg, inKube, err := server.LoadKubeConfig(n.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if inKube {
		if n.Name == "" {
			return nil, errors.New("--node-name (or NODE_NAME) is required to attest pods: set it from the downward API, fieldRef spec.nodeName")
		}
		client, err := kubernetes.NewForConfig(kcfg)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
		pods, err := attest.NewPods(attest.PodsConfig{Client: client, NodeName: n.Name, Logger: base.With(logattr.Component, "pods")})
		if err != nil {
			return nil, err
		}
		acfg.Pods = pods
		nc.Runners = append(nc.Runners, pods.Run)
		if nc.Broker != nil {
			nc.Broker.Pods = pods
		}
	} else {
		logger.Warn("no Kubernetes API server (no --kubeconfig, not in a pod): callers are attested by their unix facts only, and a process in a pod gets no pod facts")
	}
	if nc.Attestor, err = attest.New(acfg); err != nil {
		return nil, err
	}
	if !inKube {
		kcfg = nil
	}
	if err := n.identityMap(nc, base, reg, identitymap.Config{TrustDomain: td, Default: def}, kcfg); err != nil {
		return nil, err
	}
	return nc, nil
}

// broker is the broker socket's configuration; nil without one.
func (n NodeConfig) broker() (*sdsagent.BrokerConfig, error) {
	if n.BrokerSocket == "" {
		if len(n.BrokerAllow) > 0 || n.BrokerSocketGroup != "" {
			return nil, errors.New("--broker-allow and --broker-socket-group need --broker-socket, the socket brokers connect to")
		}
		return nil, nil
	}
	policy, err := broker.ParsePolicy(n.BrokerAllow)
	if err != nil {
		return nil, fmt.Errorf("--broker-allow: %w", err)
	}
	return &sdsagent.BrokerConfig{Socket: n.BrokerSocket, SocketGroup: n.BrokerSocketGroup, Policy: policy}, nil
}

// identityMap builds the identity map from --identity-map and, with
// --identity-map-crd, the ClusterIdentityMapping resources read through
// kcfg (nil: no API server), and sets nc.Map and its runners.
func (n NodeConfig) identityMap(nc *sdsagent.NodeConfig, base *slog.Logger, reg prometheus.Registerer, cfg identitymap.Config, kcfg *rest.Config) error {
	if n.IdentityMapCRD && kcfg == nil {
		return errors.New("--identity-map-crd needs a Kubernetes API server (--kubeconfig, or running in a pod): the resources are read from it")
	}
	cell := identitymap.NewCell(nil)
	comb, err := identitymap.NewCombiner(cfg, cell, identitymap.WithRegisterer(reg))
	if err != nil {
		return fmt.Errorf("identity map: %w", err)
	}
	logger := base.With(logattr.Component, "identity-map")
	if n.IdentityMap != "" {
		src := identitymap.NewFileSource(n.IdentityMap, comb, logger, 0)
		if err := src.Load(); err != nil {
			return fmt.Errorf("--identity-map: %w", err)
		}
		nc.Runners = append(nc.Runners, src.Run)
	}
	nc.Map = cell
	if !n.IdentityMapCRD {
		return nil
	}
	dyn, err := dynamic.NewForConfig(kcfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	// Read only: the server's leader writes the resources' status.
	ctl, err := mapcrd.New(mapcrd.Config{Dynamic: dyn, Map: cfg, Apply: mapcrd.CombinerApplier(comb), Current: comb.Map,
		IsLeader: func() bool { return false }, Logger: logger.With(logattr.Component, "identity-map-crd"), Registerer: reg})
	if err != nil {
		return fmt.Errorf("identity map: %w", err)
	}
	nc.Map = gatedMap{cell: cell, synced: ctl.Synced()}
	nc.Runners = append(nc.Runners, ctl.Run, func(ctx context.Context) error {
		return ctl.WatchSync(ctx, mapcrd.DefaultSyncWarn, "no workload gets an identity until they are")
	})
	return nil
}

// gatedMap is the identity map the agent serves from with
// --identity-map-crd: none (no workload has an identity, and says so)
// until the resources were read, so that no workload gets an identity
// decided on part of the rules, such as the default for a pod a resource
// gives another ID.
type gatedMap struct {
	cell   *identitymap.Cell
	synced <-chan struct{}
}

func (g gatedMap) Load() *identitymap.Map {
	select {
	case <-g.synced:
		return g.cell.Load()
	default:
		return nil
	}
}

// nodeTrustDomain is the trust domain of the node's workloads: the
// server's, from --trust-domain, --server-spiffe-id or the roots.
func nodeTrustDomain(serverID spiffeid.ID, rc *sdsagent.RotatorConfig) (spiffeid.TrustDomain, error) {
	if !serverID.IsZero() {
		return serverID.TrustDomain(), nil
	}
	id, err := caclient.ExpectedServerID(rc.Roots, spiffeid.ID{})
	if err != nil {
		return spiffeid.TrustDomain{}, fmt.Errorf("%s: the workloads' trust domain: %w", nodeFlag, err)
	}
	return id.TrustDomain(), nil
}
