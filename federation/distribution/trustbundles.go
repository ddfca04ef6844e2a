package distribution

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	certinformers "k8s.io/client-go/informers/certificates/v1beta1"
	"k8s.io/client-go/kubernetes"
	certlisters "k8s.io/client-go/listers/certificates/v1beta1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
)

// TrustBundleConfig configures TrustBundles. Client, Store and SignerName
// are required.
type TrustBundleConfig struct {
	// Client writes the ClusterTrustBundles. It needs clustertrustbundles
	// get/list/watch/create/update/delete and, to link them to the signer,
	// attest on signers named SignerName (deploy/rbac).
	Client kubernetes.Interface
	// Store supplies the bundles: one ClusterTrustBundle per trust domain
	// of every published snapshot.
	Store Source
	// SignerName links every bundle to this signer (DOMAIN/PATH).
	SignerName string
	// Logger receives the controller's logs (nil: discard).
	Logger *slog.Logger
	// Registerer receives the metrics (nil: a private registry).
	Registerer prometheus.Registerer
	// Resync is how often every bundle is reconciled again even without a
	// change (default DefaultResync).
	Resync time.Duration
	// Clock paces writes (default the real clock).
	Clock clock.PassiveClock
}

// TrustBundles keeps one signer-linked ClusterTrustBundle per trust domain
// the trust store holds, the local one and every federated one, equal to
// that trust domain's X.509 authorities: created for a new peer, updated
// on every rotation, deleted when the peer goes. Like Controller, run it
// only while holding leadership.
//
// Every bundle is linked to the signer, not only the local trust domain's:
// the API server lets only holders of attest on the signer create or
// change a signer-linked bundle, so a pod that selects our signer name and
// a trust domain label gets roots no one without that permission could
// have written. An unlinked bundle carrying the same label could be
// created by anyone allowed to create ClusterTrustBundles.
type TrustBundles struct {
	cfg     TrustBundleConfig
	log     *slog.Logger
	metrics *trustBundleMetrics
	running atomic.Bool
	run     atomic.Pointer[trustBundleRun]
	skipped atomic.Pointer[[]bundleSkip]
}

// trustBundleRun is what one Run owns.
type trustBundleRun struct {
	lister  certlisters.ClusterTrustBundleLister
	queue   workqueue.TypedRateLimitingInterface[string]
	pacer   *pacer
	synced  atomic.Bool
	content atomic.Pointer[trustBundleContent]
}

// trustBundleContent is one rendering: the wanted bundles by name.
type trustBundleContent struct {
	generation uint64
	want       map[string]wantedBundle
}

// NewTrustBundles checks cfg, applies defaults and registers the metrics.
// It starts nothing; call Run.
func NewTrustBundles(cfg TrustBundleConfig) (*TrustBundles, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("distribution: no Kubernetes client")
	case cfg.Store == nil:
		return nil, errors.New("distribution: no trust store")
	}
	if err := CheckSignerName(cfg.SignerName); err != nil {
		return nil, fmt.Errorf("distribution: %w", err)
	}
	log, err := commonDefaults(&cfg.Resync, &cfg.Clock, &cfg.Registerer, cfg.Logger)
	if err != nil {
		return nil, err
	}
	c := &TrustBundles{cfg: cfg, log: log}
	m, err := newTrustBundleMetrics(cfg.Registerer, c)
	if err != nil {
		return nil, fmt.Errorf("distribution: register metrics: %w", err)
	}
	c.metrics = m
	return c, nil
}

// Ready is nil once Run's cache has synced and a snapshot was rendered;
// an error whenever Run is not running (every follower).
func (c *TrustBundles) Ready() error {
	rs := c.run.Load()
	switch {
	case rs == nil:
		return errors.New("distribution: ClusterTrustBundles: not running")
	case !rs.synced.Load():
		return errors.New("distribution: ClusterTrustBundles: informer cache not synced yet")
	}
	return nil
}

// Skipped lists the trust domains the last rendering left without a
// ClusterTrustBundle, by trust domain: the reason and why, for status
// pages and the audit. Nil before the first rendering (and on followers,
// which do not run it).
func (c *TrustBundles) Skipped() map[string]Skip {
	p := c.skipped.Load()
	if p == nil {
		return nil
	}
	out := make(map[string]Skip, len(*p))
	for _, s := range *p {
		out[s.trustDomain] = Skip{Reason: s.reason, Message: s.err.Error()}
	}
	return out
}

// Skip is why a trust domain has no ClusterTrustBundle: Reason is the
// metric's label (too_large, no_ca_authorities, name_collision), Message
// says what to look at.
type Skip struct{ Reason, Message string }

// SignerName is the signer the bundles are linked to.
func (c *TrustBundles) SignerName() string { return c.cfg.SignerName }

// Run watches our ClusterTrustBundles and the trust store and reconciles
// until ctx is done, then stops every goroutine it started and returns
// nil. It may run again after it returns, not twice at once.
func (c *TrustBundles) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("distribution: ClusterTrustBundles: already running")
	}
	defer c.running.Store(false)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	rs := &trustBundleRun{queue: newQueue("trustbridge_cluster_trust_bundles"), pacer: newPacer(defaultWriteBurst, defaultWriteEvery)}
	defer func() {
		cancel()
		rs.queue.ShutDown()
		wg.Wait()
	}()
	changed, unsubscribe := c.cfg.Store.Subscribe()
	defer unsubscribe()
	c.renderCurrent(rs)

	informer, err := c.informer(rs)
	if err != nil {
		return err
	}
	c.run.Store(rs)
	defer c.run.Store(nil)
	wg.Go(func() { informer.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return nil
	}
	rs.synced.Store(true)
	c.log.Info("keeping a ClusterTrustBundle per trust domain", "signer", c.cfg.SignerName)
	c.enqueueAll(rs)
	wg.Go(func() {
		for c.processNext(ctx, rs) {
		}
	})
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-changed:
			if !ok {
				<-ctx.Done()
				return nil
			}
			if c.renderCurrent(rs) {
				c.enqueueAll(rs)
			}
		}
	}
}

// informer watches the ClusterTrustBundles linked to our signer (a field
// selector the API server supports for this resource) and queues the name
// of each one that changes.
func (c *TrustBundles) informer(rs *trustBundleRun) (cache.SharedIndexInformer, error) {
	inf := certinformers.NewFilteredClusterTrustBundleInformer(c.cfg.Client, c.cfg.Resync, cache.Indexers{},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", c.cfg.SignerName).String()
		})
	rs.lister = certlisters.NewClusterTrustBundleLister(inf.GetIndexer())
	enqueue := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if b, ok := obj.(*certv1beta1.ClusterTrustBundle); ok {
			rs.queue.Add(b.Name)
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	})
	if err != nil {
		return nil, fmt.Errorf("distribution: ClusterTrustBundle informer: %w", err)
	}
	return inf, nil
}

// renderCurrent renders the store's snapshot once per generation and
// reports whether the wanted bundles changed.
func (c *TrustBundles) renderCurrent(rs *trustBundleRun) bool {
	sn := c.cfg.Store.Snapshot()
	cur := rs.content.Load()
	if cur != nil && cur.generation == sn.Generation() {
		return false
	}
	want, skips := renderTrustBundles(sn, c.cfg.SignerName)
	c.skipped.Store(&skips)
	for _, s := range skips {
		c.log.Warn("trust domain left without a ClusterTrustBundle", logattr.TrustDomain, s.trustDomain,
			"reason", s.reason, logattr.Error, s.err)
	}
	for _, w := range want {
		if w.dropped > 0 {
			c.log.Warn("X.509 authorities that are not CA certificates left out of the trust domain's ClusterTrustBundle",
				logattr.TrustDomain, w.trustDomain, "left_out", w.dropped)
		}
	}
	rs.content.Store(&trustBundleContent{generation: sn.Generation(), want: want})
	return cur == nil || !maps.EqualFunc(cur.want, want, sameBundle)
}

func sameBundle(a, b wantedBundle) bool {
	return a.pem == b.pem && maps.Equal(a.labels, b.labels)
}

// enqueueAll queues every wanted bundle and every one of ours the cache
// holds (which may need deleting).
func (c *TrustBundles) enqueueAll(rs *trustBundleRun) {
	if cur := rs.content.Load(); cur != nil {
		for name := range cur.want {
			rs.queue.Add(name)
		}
	}
	held, _ := rs.lister.List(labels.Everything())
	for _, b := range held {
		rs.queue.Add(b.Name)
	}
}

func (c *TrustBundles) processNext(ctx context.Context, rs *trustBundleRun) bool {
	name, quit := rs.queue.Get()
	if quit {
		return false
	}
	defer rs.queue.Done(name)
	err := c.reconcile(ctx, rs, name)
	switch te := (*throttledError)(nil); {
	case err == nil:
		rs.queue.Forget(name)
	case ctx.Err() != nil:
	case errors.As(err, &te):
		c.metrics.writes.WithLabelValues(resultThrottled).Inc()
		c.log.Warn("ClusterTrustBundle rewritten too often; postponing the next write", "cluster_trust_bundle", name,
			"delay", te.delay, logattr.Error, err)
		rs.queue.Forget(name)
		rs.queue.AddAfter(name, te.delay)
	case apierrors.IsInvalid(err):
		// Asking again with the same content cannot succeed (an API
		// server stricter than our checks): the next change of the
		// trust domain's bundle, or the resync, tries again.
		c.log.Error("the API server refuses the ClusterTrustBundle; not retried until its trust domain's bundle changes",
			"cluster_trust_bundle", name, logattr.Error, err)
		rs.queue.Forget(name)
	default:
		c.log.Warn("cannot reconcile ClusterTrustBundle; retrying with backoff", "cluster_trust_bundle", name, logattr.Error, err)
		rs.queue.AddRateLimited(name)
	}
	return true
}

// reconcile brings the bundle called name to its wanted state. A bundle
// we did not write (no managed-by label) is never touched; one of ours no
// longer wanted (a peer removed) is deleted, so that a cluster does not
// keep trusting roots no one rotates any more.
func (c *TrustBundles) reconcile(ctx context.Context, rs *trustBundleRun, name string) error {
	cur := rs.content.Load()
	if cur == nil {
		return nil
	}
	held, err := rs.lister.Get(name)
	if apierrors.IsNotFound(err) {
		held, err = nil, nil
	}
	if err != nil {
		return err
	}
	want, wanted := cur.want[name]
	if held != nil && held.Labels[ManagedByLabel] != ManagedByValue {
		c.metrics.foreign.Inc()
		c.log.Warn("a ClusterTrustBundle with our name and signer exists but is not managed by trustbridge; leaving it alone",
			"cluster_trust_bundle", name, "label", ManagedByLabel+"="+ManagedByValue)
		return nil
	}
	if (!wanted && held == nil) || (wanted && held != nil && holds(held, want)) {
		return nil
	}
	if err := c.pace(rs, name); err != nil {
		return err
	}
	switch {
	case !wanted:
		return c.deleteBundle(ctx, rs, held)
	case held == nil:
		return c.write(ctx, rs, c.newBundle(name, want), resultCreated)
	default:
		next := held.DeepCopy()
		next.Spec.TrustBundle = want.pem
		maps.Copy(next.Labels, want.labels)
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		next.Annotations[TrustDomainAnnotation] = want.trustDomain
		return c.write(ctx, rs, next, resultUpdated)
	}
}

// holds reports whether b, one of ours, is already what want describes.
func holds(b *certv1beta1.ClusterTrustBundle, want wantedBundle) bool {
	return b.Spec.TrustBundle == want.pem && labelsHold(b.Labels, want.labels) && b.Annotations[TrustDomainAnnotation] == want.trustDomain
}

func labelsHold(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func (c *TrustBundles) newBundle(name string, want wantedBundle) *certv1beta1.ClusterTrustBundle {
	return &certv1beta1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      maps.Clone(want.labels),
			Annotations: map[string]string{TrustDomainAnnotation: want.trustDomain},
		},
		Spec: certv1beta1.ClusterTrustBundleSpec{SignerName: c.cfg.SignerName, TrustBundle: want.pem},
	}
}

func (c *TrustBundles) pace(rs *trustBundleRun, name string) error {
	if d := rs.pacer.wait(name, c.cfg.Clock.Now()); d > 0 {
		return &throttledError{delay: d}
	}
	return nil
}

// write creates or updates b (carrying the cached resourceVersion, so a
// concurrent change conflicts and is retried from the newer object).
func (c *TrustBundles) write(ctx context.Context, rs *trustBundleRun, b *certv1beta1.ClusterTrustBundle, result string) error {
	api := c.cfg.Client.CertificatesV1beta1().ClusterTrustBundles()
	var err error
	if result == resultCreated {
		_, err = api.Create(ctx, b, metav1.CreateOptions{})
	} else {
		_, err = api.Update(ctx, b, metav1.UpdateOptions{})
	}
	if err != nil {
		return c.writeFailed(err)
	}
	rs.pacer.wrote(b.Name, c.cfg.Clock.Now())
	c.metrics.writes.WithLabelValues(result).Inc()
	c.log.Info(result+" ClusterTrustBundle", "cluster_trust_bundle", b.Name, logattr.TrustDomain, b.Annotations[TrustDomainAnnotation])
	return nil
}

func (c *TrustBundles) deleteBundle(ctx context.Context, rs *trustBundleRun, b *certv1beta1.ClusterTrustBundle) error {
	uid, rv := b.UID, b.ResourceVersion
	err := c.cfg.Client.CertificatesV1beta1().ClusterTrustBundles().Delete(ctx, b.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return c.writeFailed(err)
	}
	rs.pacer.wrote(b.Name, c.cfg.Clock.Now())
	c.metrics.writes.WithLabelValues(resultDeleted).Inc()
	c.log.Info("deleted ClusterTrustBundle: its trust domain is no longer held", "cluster_trust_bundle", b.Name,
		logattr.TrustDomain, b.Annotations[TrustDomainAnnotation])
	return nil
}

func (c *TrustBundles) writeFailed(err error) error {
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		c.metrics.writes.WithLabelValues(resultConflict).Inc()
	} else {
		c.metrics.writes.WithLabelValues(resultError).Inc()
	}
	return err
}

// trustBundleMetrics are the controller's metrics.
type trustBundleMetrics struct {
	writes  *prometheus.CounterVec
	foreign prometheus.Counter
}

// resultThrottled counts writes postponed by the pacer.
const resultThrottled = "throttled"

var descTrustBundleSkipped = prometheus.NewDesc("trustbridge_cluster_trust_bundles_skipped",
	"Trust domains the trust store holds that have no ClusterTrustBundle (1 each), by reason: too_large (over 1 MiB), no_ca_authorities or name_collision.",
	[]string{"trust_domain", "reason"}, nil)

func newTrustBundleMetrics(reg prometheus.Registerer, c *TrustBundles) (*trustBundleMetrics, error) {
	m := &trustBundleMetrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_cluster_trust_bundle_writes_total",
			Help: "Writes of ClusterTrustBundles by result (created, updated, deleted, conflict, error, throttled).",
		}, []string{"result"}),
		foreign: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_cluster_trust_bundle_foreign_total",
			Help: "Reconciles that found a ClusterTrustBundle of our name and signer not managed by trustbridge, and left it alone.",
		}),
	}
	for _, col := range []prometheus.Collector{m.writes, m.foreign, trustBundleSkips{c}} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{resultCreated, resultUpdated, resultDeleted, resultConflict, resultError, resultThrottled} {
		m.writes.WithLabelValues(r)
	}
	return m, nil
}

// trustBundleSkips reports the last rendering's skipped trust domains at
// scrape time.
type trustBundleSkips struct{ c *TrustBundles }

func (s trustBundleSkips) Describe(ch chan<- *prometheus.Desc) { ch <- descTrustBundleSkipped }

func (s trustBundleSkips) Collect(ch chan<- prometheus.Metric) {
	p := s.c.skipped.Load()
	if p == nil {
		return
	}
	skips := slices.Clone(*p)
	for _, sk := range skips {
		ch <- prometheus.MustNewConstMetric(descTrustBundleSkipped, prometheus.GaugeValue, 1, sk.trustDomain, sk.reason)
	}
}
