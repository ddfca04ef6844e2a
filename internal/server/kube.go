package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/kubestore"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/crd"
	"github.com/trustbridge/trustbridge/federation/distribution"
	"github.com/trustbridge/trustbridge/federation/kubelkg"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/kube/leader"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/server/ha"
)

// Storage backends for --storage.
const (
	StorageFile = "file"
	StorageKube = "kube"
)

// klogOnce: klog is process-wide; the first server's logger takes it.
var klogOnce sync.Once

// routeKlog sends client-go's klog output (leader election, informers,
// TokenReview clients) through our logger, in our format.
func routeKlog(logger *slog.Logger) {
	klogOnce.Do(func() { klog.SetSlogLogger(logger.With(logattr.Component, "client-go")) })
}

// serviceAccountNamespaceFile is where a pod finds its own namespace.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

type KubeConfig struct {
	Storage           string
	Namespace         string
	CASecret          string
	LeaderLease       string
	LeaseDuration     time.Duration
	RenewDeadline     time.Duration
	RetryPeriod       time.Duration
	RootConfigMap     string
	NamespaceSelector string
	Distribution      DistributionConfig
	FederationCRD     bool
	FederationClass   string
	TrustPolicyCRD    bool
	IdentityMapCRD    bool
	// TrustBundleSigner, when set, has the leader keep a ClusterTrustBundle
	// per trust domain linked to this signer name.
	TrustBundleSigner string
	// PodCertSigner, when set, has the leader sign the
	// PodCertificateRequests naming it, for pods of the namespaces
	// PodCertNamespaces selects (pod_identity.go).
	PodCertSigner     string
	PodCertNamespaces string
	tokenSecret       string
}

func addKubeFlags(f *pflag.FlagSet, o *KubeConfig) {
	f.StringVar(&o.Storage, "storage", StorageFile, "where CA state and last-known-good federated bundles live: file (--data-dir) or kube (a Secret and ConfigMaps in --namespace; several replicas elect a leader; not with --ca-dir; ca issue and ca rotate read only file storage, use ca request)")
	f.StringVar(&o.Namespace, "namespace", "", "namespace of the CA Secret, the leader Lease and the federated bundles with --storage kube (default: env POD_NAMESPACE, else the pod's own namespace)")
	f.StringVar(&o.CASecret, "ca-secret", kubestore.DefaultName, "name of the Secret holding the CA state with --storage kube")
	f.StringVar(&o.tokenSecret, "bootstrap-token-secret", authn.DefaultLedgerSecret, "name of the Secret in --namespace where replicas record the single-use bootstrap tokens (--bootstrap-token-file) consumed, by reference, never the token, with --storage kube")
	f.StringVar(&o.LeaderLease, "leader-lease", leader.DefaultName, "name of the coordination.k8s.io Lease replicas elect a leader with")
	f.DurationVar(&o.LeaseDuration, "leader-lease-duration", leader.DefaultLeaseDuration, "how long a dead leader's Lease blocks a successor: followers take over within this")
	f.DurationVar(&o.RenewDeadline, "leader-renew-deadline", leader.DefaultRenewDeadline, "a leader that could not renew for this long stops writing and steps down")
	f.DurationVar(&o.RetryPeriod, "leader-retry-period", leader.DefaultRetryPeriod, "how often the Lease is renewed or tried")
	f.StringVar(&o.RootConfigMap, "root-configmap", distribution.DefaultName, `with --storage kube, the ConfigMap kept in every namespace matching --namespace-selector: root-cert.pem (local roots), bundle.spiffe.json (SPIFFE bundle map of every trust domain) and <trust-domain>.pem per federated trust domain; "" disables it`)
	f.StringVar(&o.NamespaceSelector, "namespace-selector", "", "label selector of the namespaces that get --root-configmap and --root-secret (default: all)")
	addDistributionFlags(f, &o.Distribution)
	f.BoolVar(&o.FederationCRD, "federation-crd", false, "with --storage kube, federate with the trust domains of ClusterFederatedTrustDomain resources (trustbridge.dev/v1alpha1, deploy/base/crd.yaml) as they are created, edited and deleted, and write each one's polling state into its status")
	f.BoolVar(&o.TrustPolicyCRD, "trust-policy-crd", false, "with --storage kube, add the rules of ClusterTrustPolicy resources (trustbridge.dev/v1alpha1, deploy/base/trustpolicy-crd.yaml) to the trust policy as they are created, edited and deleted, and write whether each is applied, which workloads it matched and its conflicts into its status")
	f.BoolVar(&o.IdentityMapCRD, "identity-map-crd", false, "with --storage kube, add the rules of ClusterIdentityMapping resources (trustbridge.dev/v1alpha1, deploy/base/identitymapping-crd.yaml) to the identity map (--identity-map) node agents are checked against, and write whether each is accepted and its conflicts into its status; node agents are refused as unavailable until the resources were read")
	f.StringVar(&o.TrustBundleSigner, "cluster-trust-bundle-signer", "", "with --storage kube, keep one ClusterTrustBundle (certificates.k8s.io/v1beta1) per trust domain, local and federated, linked to this signer name (DOMAIN/PATH, normally --pod-certificate-signer's): pods mount a trust domain's roots with a clusterTrustBundle projection of this signerName and the label "+distribution.TrustDomainLabel+"=TD. Needs the ClusterTrustBundle API and attest on the signer (docs/kubernetes-pod-identity.md)")
	f.StringVar(&o.PodCertSigner, "pod-certificate-signer", "", "with --storage kube, sign the PodCertificateRequests (certificates.k8s.io/v1beta1) naming this signer (DOMAIN/PATH, e.g. trustbridge.io/svid): pods with a projected podCertificate volume of it get the X509-SVID spiffe://<trust-domain>/ns/<namespace>/sa/<service-account> from the kubelet, without an agent. Needs --pod-certificate-namespaces, the PodCertificateRequest API and deploy/rbac/pod-identity (docs/kubernetes-pod-identity.md)")
	f.StringVar(&o.PodCertNamespaces, "pod-certificate-namespaces", "", "label selector of the namespaces whose pods --pod-certificate-signer signs for; requests from any other are Denied (every namespace: kubernetes.io/metadata.name)")
	f.StringVar(&o.FederationClass, "federation-crd-class", "", "act only on ClusterFederatedTrustDomain resources whose spec.className is this (and those without one); without it, only on those without one")
}

// kubeSetup is trustbridge on Kubernetes: shared state and one leader.
type kubeSetup struct {
	namespace string
	elector   *leader.Elector
	caStore   *kubestore.Store
	lkg       *kubelkg.Store
	client    kubernetes.Interface
	dynamic   dynamic.Interface
	selector  labels.Selector
	o         KubeConfig

	replica *ha.Replica // set by start
	nudgeCA func()      // set by start: wakes the CA's subscribers
	// bundles is --cluster-trust-bundle-signer's controller, set by wire
	// before anything serves; nil without it.
	bundles *distribution.TrustBundles
}

// clusterTrustBundles is the snapshot's view of the ClusterTrustBundles:
// nil without them, and on a follower (only the leader renders).
func (k *kubeSetup) clusterTrustBundles() *api.ClusterTrustBundles {
	if k == nil || k.bundles == nil {
		return nil
	}
	skipped := k.bundles.Skipped()
	if skipped == nil {
		return nil
	}
	out := &api.ClusterTrustBundles{Signer: k.bundles.SignerName(), Skipped: []api.SkippedTrustBundle{}}
	for _, td := range slices.Sorted(maps.Keys(skipped)) {
		out.Skipped = append(out.Skipped, api.SkippedTrustBundle{TrustDomain: td, Reason: skipped[td].Reason, Message: skipped[td].Message})
	}
	return out
}

// checkStorageFlags refuses flag combinations --storage cannot honour,
// before anything connects or loads.
func checkStorageFlags(o Config) error {
	if o.Kube.TrustPolicyCRD && o.Kube.Storage != StorageKube {
		return errPolicyCRDStorage
	}
	if o.Kube.IdentityMapCRD && o.Kube.Storage != StorageKube {
		return errIdentityMapCRDStorage
	}
	if o.Kube.FederationCRD && o.Kube.Storage != StorageKube {
		return errors.New("--federation-crd needs --storage kube: the resources are read from the API server, and replicas share their state there")
	}
	if err := checkPodCertFlags(o.Kube, o.MaxWorkloadTTL); err != nil {
		return err
	}
	if err := checkDistributionFlags(o.Kube); err != nil {
		return err
	}
	if o.Kube.TrustBundleSigner != "" {
		if o.Kube.Storage != StorageKube {
			return errors.New("--cluster-trust-bundle-signer needs --storage kube: the leader writes the ClusterTrustBundles to the API server")
		}
		if err := distribution.CheckSignerName(o.Kube.TrustBundleSigner); err != nil {
			return fmt.Errorf("--cluster-trust-bundle-signer: %w", err)
		}
	}
	if o.Kube.Storage == StorageKube && o.CADir != "" {
		return errors.New("--ca-dir and --storage kube do not combine: a plug-in CA is each replica's own directory, with no shared state and no leader; run --ca-dir with --storage file (the default)")
	}
	return nil
}

// setupKube connects to the API server for --storage kube; it returns nil
// for file storage.
func setupKube(o KubeConfig, kubeconfig string, reg prometheus.Registerer, logger *slog.Logger) (*kubeSetup, error) {
	switch o.Storage {
	case "", StorageFile:
		return nil, nil
	case StorageKube:
	default:
		return nil, fmt.Errorf("--storage %q: want file or kube", o.Storage)
	}
	sel := labels.Everything()
	if o.NamespaceSelector != "" {
		var err error
		if sel, err = labels.Parse(o.NamespaceSelector); err != nil {
			return nil, fmt.Errorf("--namespace-selector %q: %w", o.NamespaceSelector, err)
		}
	}
	cfg, ok, err := LoadKubeConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errors.New("--storage kube needs --kubeconfig or an in-cluster config (KUBERNETES_SERVICE_HOST)")
	}
	ns, err := kubeNamespace(o.Namespace)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	el, err := leader.New(leader.Config{
		Client: client, Namespace: ns, Name: o.LeaderLease,
		LeaseDuration: o.LeaseDuration, RenewDeadline: o.RenewDeadline, RetryPeriod: o.RetryPeriod,
		Logger: logger.With(logattr.Component, "leader"), Registerer: reg,
	})
	if err != nil {
		return nil, err
	}
	st, err := kubestore.New(kubestore.Config{Client: client, Namespace: ns, Name: o.CASecret, Leader: el, Logger: logger.With(logattr.Component, "ca-store")})
	if err != nil {
		return nil, err
	}
	lkg, err := kubelkg.New(kubelkg.Config{Client: client, Namespace: ns, Leader: el, Logger: logger.With(logattr.Component, "federation-store")})
	if err != nil {
		return nil, err
	}
	return &kubeSetup{namespace: ns, elector: el, caStore: st, lkg: lkg, client: client, dynamic: dyn, selector: sel, o: o}, nil
}

// kubeNamespace is --namespace, else POD_NAMESPACE, else the pod's own.
func kubeNamespace(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns, nil
	}
	if data, err := os.ReadFile(serviceAccountNamespaceFile); err == nil {
		if ns := strings.TrimSpace(string(data)); ns != "" {
			return ns, nil
		}
	}
	return "", errors.New("--storage kube needs --namespace (or env POD_NAMESPACE, or running in a pod)")
}

// caConfig points the CA at the Secret, fenced by leadership.
func (k *kubeSetup) caConfig(c *ca.Config) {
	if k == nil {
		return
	}
	c.Backend = k.caStore
	c.Leader = k.elector
}

// lastKnownGood is where federated bundles persist: ConfigMaps with kube
// storage, files in the data directory otherwise.
func (k *kubeSetup) lastKnownGood(dataDir string) federation.LastKnownGood {
	if k == nil {
		return federation.NewLKGStore(dataDir)
	}
	return k.lkg
}

// describe names where CA state lives, for the banner; "" without
// Kubernetes storage.
func (k *kubeSetup) describe() string {
	if k == nil {
		return ""
	}
	return fmt.Sprintf("state in Secret %s/%s, leader elected with Lease %s/%s (this replica: %s)",
		k.namespace, k.o.CASecret, k.namespace, k.o.LeaderLease, k.elector.Identity())
}

// start runs, in the background, what every replica needs before it can
// sign: the leader election (whose leader bootstraps or rotates roots) and
// the watch on the CA Secret (through which followers load them). It
// returns once the CA can sign, so serving certificates can be issued;
// the leader's other duties wait for wire. When ctx ends first it returns
// a nil replica and the background parts' error.
func (k *kubeSetup) start(ctx context.Context, a *ca.Authority, logger *slog.Logger) (*ha.Replica, error) {
	r, err := ha.Start(ctx, ha.Config{
		CA: a, WatchCA: k.caStore.Watch, Elector: k.elector,
		State: k.namespace + "/" + k.o.CASecret, Logger: logger,
	})
	k.replica, k.nudgeCA = r, a.Recheck
	return r, err
}

// federationCRD is the controller of the ClusterFederatedTrustDomain
// resources (--federation-crd), nil when they are not configured. Trust
// domains the flags or files configure are reserved: a resource for one is
// refused as a conflict.
func (k *kubeSetup) federationCRD(td spiffeid.TrustDomain, fed *federationSetup, reg prometheus.Registerer, logger *slog.Logger) (*crd.Controller, error) {
	if k == nil || !k.o.FederationCRD || fed.poller == nil {
		return nil, nil
	}
	static, origins := fed.staticSet()
	reserved := map[spiffeid.TrustDomain]string{}
	for td, origin := range origins {
		reserved[td] = map[string]string{"flag": "--federate (or SPIFFE_BUNDLE_ENDPOINTS)", "file": "--federation-config"}[origin]
	}
	return crd.New(crd.Config{
		Dynamic: k.dynamic, Events: k.client, LocalTrustDomain: td, Reserved: reserved, Static: static, Held: fed.holds, ClassName: k.o.FederationClass,
		Apply: fed.applyCRD, Status: fed.poller.Status, IsLeader: k.elector.IsLeader,
		Logger: logger.With(logattr.Component, "federation-crd"), Registerer: reg,
	})
}

// wire hands the leader its federation poller and root distribution and
// returns what runs on every replica besides start's: followers reload the
// federated bundles the leader saves.
func (k *kubeSetup) wire(td spiffeid.TrustDomain, fed *federationSetup, ctl *crd.Controller, reg prometheus.Registerer, logger *slog.Logger,
	leaderExtra ...func(context.Context) error) ([]func(context.Context) error, error) {
	dists, err := k.distributions(td, fed, reg, logger)
	if err != nil {
		return nil, err
	}
	duties := append(k.leaderDuties(fed.poller, dists, logger), leaderExtra...)
	if k.o.TrustBundleSigner != "" {
		tb, err := distribution.NewTrustBundles(distribution.TrustBundleConfig{
			Client: k.client, Store: fed.store, SignerName: k.o.TrustBundleSigner,
			Logger: logger.With(logattr.Component, "cluster-trust-bundles"), Registerer: reg,
		})
		if err != nil {
			return nil, fmt.Errorf("--cluster-trust-bundle-signer: %w", err)
		}
		k.bundles = tb
		duties = append(duties, tb.Run)
	}
	k.replica.Lead(duties...)
	if fed.poller == nil {
		return nil, nil
	}
	var runners []func(context.Context) error
	if ctl != nil {
		// Every replica: followers keep the same endpoints, so a new
		// leader polls them at once.
		runners = append(runners, ctl.Run)
	}
	p := fed.poller
	return append(runners, func(ctx context.Context) error {
		return k.lkg.Watch(ctx, func(td spiffeid.TrustDomain) {
			// Also on the leader: an event may be its own save (then the
			// load finds what it holds and changes nothing), or a save of
			// the previous leader delivered only now, because the watch
			// was down across the failover; skipping that one would leave
			// the new leader serving an older bundle than the stored one.
			if err := p.LoadLastKnownGoodFor(td); err != nil {
				logger.Error("federated bundle saved by the leader not taken", logattr.TrustDomain, td.Name(), logattr.Error, err)
			}
		})
	}), nil
}

// distributions makes the controllers of --root-configmap and
// --root-secret, those that are set.
func (k *kubeSetup) distributions(td spiffeid.TrustDomain, fed *federationSetup, reg prometheus.Registerer, logger *slog.Logger) ([]*distribution.Controller, error) {
	base, err := k.o.Distribution.distributionConfig()
	if err != nil {
		return nil, err
	}
	var dists []*distribution.Controller
	for _, t := range []struct {
		kind distribution.Kind
		name string
	}{{distribution.KindConfigMap, k.o.RootConfigMap}, {distribution.KindSecret, k.o.Distribution.RootSecret}} {
		if t.name == "" {
			continue
		}
		cfg := base
		cfg.Client, cfg.Store, cfg.TrustDomain, cfg.Name, cfg.Kind = k.client, fed.store, td, t.name, t.kind
		cfg.NamespaceSelector, cfg.Registerer = k.selector, reg
		cfg.Logger = logger.With(logattr.Component, "distribution", "kind", t.kind)
		d, err := distribution.New(cfg)
		if err != nil {
			return nil, err
		}
		dists = append(dists, d)
	}
	return dists, nil
}

// leaderDuties is what the leader runs besides the CA's rotation: the
// federation poller, after reloading what the previous leader saved, and
// the root distribution.
func (k *kubeSetup) leaderDuties(p *federation.Poller, dists []*distribution.Controller, logger *slog.Logger) []func(context.Context) error {
	// The audit trail, which writes only while leading, looks again at
	// the CA now: a failure that began before this term is recorded.
	duties := []func(context.Context) error{func(ctx context.Context) error {
		k.nudgeCA()
		<-ctx.Done()
		return nil
	}}
	if p != nil {
		log := logger.With(logattr.Component, "leader")
		duties = append(duties, func(ctx context.Context) error {
			// Everything the previous leader saved was written before its
			// lease could lapse, so before this replica was elected: read
			// it now rather than trust that its watch events arrived.
			for _, err := range p.LoadLastKnownGood() {
				log.Error("last-known-good bundle not reloaded on taking the lead", logattr.Error, err)
			}
			return p.Run(ctx)
		})
	}
	for _, d := range dists {
		duties = append(duties, d.Run)
	}
	return duties
}
