package distribution

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	pkcs12 "software.sslmate.com/src/go-pkcs12"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// DefaultName is the name of the distributed ConfigMap (--root-configmap).
const DefaultName = "trustbridge-ca-root-cert"

// The label that marks a ConfigMap as trustbridge's. Only ConfigMaps that
// carry it are ever updated or deleted; removing it hands the ConfigMap
// over to whoever removed it.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "trustbridge"
)

// Defaults applied by New.
const (
	DefaultWorkers = 2
	DefaultResync  = 10 * time.Minute
)

// Writes to one namespace's ConfigMap are paced: defaultWriteBurst at
// once, then one per defaultWriteEvery. A trust store change or a repair
// costs a namespace one write, far below that.
const (
	defaultWriteBurst = 10
	defaultWriteEvery = time.Minute
)

// Source is the trust store as the controller reads it; *trust.Store
// implements it.
type Source interface {
	Snapshot() *trust.Snapshot
	Subscribe() (<-chan struct{}, func())
}

// Config configures a Controller. Client, Store and TrustDomain are
// required.
type Config struct {
	// Client writes the ConfigMaps. It needs the permissions of
	// deploy/rbac: namespaces get/list/watch, and ConfigMaps named Name
	// get/list/watch/create/update/delete in every namespace.
	Client kubernetes.Interface
	// Store supplies the bundles; every published snapshot is rendered
	// once and written to every selected namespace.
	Store Source
	// TrustDomain is the local trust domain, whose roots go to
	// root-cert.pem. Until the store holds its bundle nothing is written.
	TrustDomain spiffeid.TrustDomain
	// Name is the object's name (default DefaultName).
	Name string
	// Kind is what is kept in every namespace (default KindConfigMap). A
	// KindSecret controller needs deploy/rbac/distribution-secret.
	Kind Kind
	// Truststore adds a PKCS#12 truststore of the local roots.
	Truststore Truststore
	// Labels and Annotations are set on every object written, besides
	// the managed-by label, which they must not name.
	Labels, Annotations map[string]string
	// NamespaceSelector picks the namespaces (default: all).
	NamespaceSelector labels.Selector
	// Logger receives the controller's logs (nil: discard).
	Logger *slog.Logger
	// Registerer receives the metrics (nil: a private registry).
	Registerer prometheus.Registerer
	// Workers is the number of namespaces reconciled in parallel
	// (default DefaultWorkers).
	Workers int
	// Resync is how often every namespace is reconciled again even without
	// a change, as a safety net (default DefaultResync).
	Resync time.Duration
	// Clock stamps trustbridge_distribution_last_sync_timestamp_seconds
	// (default the real clock).
	Clock clock.PassiveClock
}

// Controller keeps the trust ConfigMap in every selected namespace equal
// to the rendering of the current trust store snapshot. Run it only while
// holding leadership: it has no fence of its own, and followers must not
// run it at all.
type Controller struct {
	cfg     Config
	target  target
	enc     *pkcs12.Encoder // nil without a truststore
	log     *slog.Logger
	metrics *metrics
	running atomic.Bool
	run     atomic.Pointer[runState]
	// writeBurst and writeEvery pace writes to one namespace; see pacer.
	writeBurst int
	writeEvery time.Duration
}

// runState is what one Run owns: informers, caches, the queue and the
// current rendering. A later Run (a new leadership term) starts afresh.
type runState struct {
	nsLister corelisters.NamespaceLister
	objects  cache.Indexer // ours and same-named foreign objects
	queue    workqueue.TypedRateLimitingInterface[string]
	pacer    *pacer
	synced   atomic.Bool
	content  atomic.Pointer[content]
	// renderErr is the last rendering failure, nil once one succeeds.
	renderErr atomic.Pointer[error]
}

// content is one rendering, and the store generation it came from.
type content struct {
	generation uint64
	data       map[string]string
	// truststore and the roots it holds, nil without one.
	truststore []byte
	roots      []*x509.Certificate
	// opened caches, by SHA-256, which other encodings were found to
	// hold exactly roots: decoding one per namespace on every resync and
	// scrape would cost key derivations for nothing.
	opened sync.Map
}

// holdsRoots reports whether truststore p12 holds exactly c's roots
// under password.
func (c *content) holdsRoots(p12 []byte, password string) bool {
	if bytes.Equal(p12, c.truststore) {
		return true
	}
	sum := sha256.Sum256(p12)
	if ok, seen := c.opened.Load(sum); seen {
		return ok.(bool)
	}
	ok := truststoreHolds(p12, password, c.roots)
	c.opened.Store(sum, ok)
	return ok
}

// check checks cfg's required fields, names and metadata, and sets the
// defaults of Name, Kind and NamespaceSelector.
func (cfg *Config) check() error {
	if cfg.Client == nil {
		return errors.New("distribution: no Kubernetes client")
	}
	if cfg.Store == nil {
		return errors.New("distribution: no trust store")
	}
	if cfg.TrustDomain.IsZero() {
		return errors.New("distribution: no local trust domain")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Kind == "" {
		cfg.Kind = KindConfigMap
	}
	if errs := validation.IsDNS1123Subdomain(cfg.Name); len(errs) > 0 {
		return fmt.Errorf("distribution: %s name %q: %s", cfg.Kind, cfg.Name, strings.Join(errs, "; "))
	}
	if err := checkMetadata(cfg.Labels, cfg.Annotations); err != nil {
		return fmt.Errorf("distribution: %w", err)
	}
	if cfg.NamespaceSelector == nil {
		cfg.NamespaceSelector = labels.Everything()
	}
	return nil
}

// New checks cfg, applies defaults and registers the metrics. It starts
// nothing; call Run.
func New(cfg Config) (*Controller, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Workers < 0 {
		return nil, fmt.Errorf("distribution: workers must not be negative, got %d", cfg.Workers)
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	log, err := commonDefaults(&cfg.Resync, &cfg.Clock, &cfg.Registerer, cfg.Logger)
	if err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, log: log, writeBurst: defaultWriteBurst, writeEvery: defaultWriteEvery}
	if c.target, err = targetFor(cfg.Kind); err != nil {
		return nil, fmt.Errorf("distribution: %w", err)
	}
	if cfg.Truststore.Enabled {
		if c.enc, err = cfg.Truststore.encoder(); err != nil {
			return nil, fmt.Errorf("distribution: %w", err)
		}
	}
	m, err := newMetrics(cfg.Registerer, c)
	if err != nil {
		return nil, fmt.Errorf("distribution: register metrics: %w", err)
	}
	c.metrics = m
	return c, nil
}

// Ready reports whether the controller is distributing: nil once Run's
// informer caches have synced and a snapshot holding the local trust
// domain has been rendered. Later rendering failures keep the last good
// content in place and show in logs and in
// trustbridge_distribution_render_errors_total, not here, so that one
// broken federated bundle does not take a replica out of service. Ready
// fails whenever Run is not running, as on every follower: it belongs in
// the readiness of the leader's term only, not of every replica.
func (c *Controller) Ready() error {
	rs := c.run.Load()
	if rs == nil {
		return errors.New("distribution: not running")
	}
	if !rs.synced.Load() {
		return errors.New("distribution: informer caches not synced yet")
	}
	if rs.content.Load() == nil {
		if p := rs.renderErr.Load(); p != nil {
			return fmt.Errorf("distribution: nothing to distribute: %w", *p)
		}
		return errors.New("distribution: nothing to distribute yet")
	}
	return nil
}

// Run watches namespaces, ConfigMaps and the trust store and reconciles
// until ctx is done, then stops every goroutine it started and returns
// nil. Run may be called again after it returns (a new leadership term),
// but not twice at once.
func (c *Controller) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("distribution: already running")
	}
	defer c.running.Store(false)

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	rs := c.newRunState()
	defer func() {
		// In this order: workers block in Get until the queue shuts down.
		cancel()
		rs.queue.ShutDown()
		wg.Wait()
	}()
	// Subscribe before the first read so that no change slips between
	// them.
	changed, unsubscribe := c.cfg.Store.Subscribe()
	defer unsubscribe()
	c.renderCurrent(rs)

	nsInformer, cmInformer, err := c.informers(rs)
	if err != nil {
		return err
	}

	c.run.Store(rs)
	defer c.run.Store(nil)

	wg.Go(func() { nsInformer.RunWithContext(ctx) })
	wg.Go(func() { cmInformer.RunWithContext(ctx) })

	if !cache.WaitForCacheSync(ctx.Done(), nsInformer.HasSynced, cmInformer.HasSynced) {
		return nil // ctx is done
	}
	rs.synced.Store(true)
	c.log.Info("distributing trust "+string(c.cfg.Kind), "name", c.cfg.Name,
		"namespace_selector", c.cfg.NamespaceSelector.String(), logattr.TrustDomain, c.cfg.TrustDomain.Name())
	for range c.cfg.Workers {
		wg.Go(func() {
			for c.processNext(ctx, rs) {
			}
		})
	}
	c.followStore(ctx, rs, changed)
	return nil
}

// newRunState makes a Run's state: a rate-limited queue of namespaces
// and a fresh pacer. The listers are set by informers.
func (c *Controller) newRunState() *runState {
	return &runState{queue: newQueue("trustbridge_distribution"), pacer: newPacer(c.writeBurst, c.writeEvery)}
}

// newQueue is a controller's work queue: each key retried with backoff
// from 10ms to a minute, all keys together at most 20 a second after a
// burst of 200.
func newQueue(name string) workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](10*time.Millisecond, time.Minute),
			&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(20), 200)},
		),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: name},
	)
}

// informers makes the namespace and ConfigMap informers, sets rs's
// listers to their caches, and has their events queue the namespace
// they are about. It starts neither.
func (c *Controller) informers(rs *runState) (nsInformer, cmInformer cache.SharedIndexInformer, err error) {
	nsInformer = coreinformers.NewFilteredNamespaceInformer(c.cfg.Client, c.cfg.Resync, cache.Indexers{},
		func(o *metav1.ListOptions) { o.LabelSelector = c.cfg.NamespaceSelector.String() })
	cmInformer = c.target.informer(c.cfg.Client, c.cfg.Resync, c.cfg.Name)
	rs.nsLister = corelisters.NewNamespaceLister(nsInformer.GetIndexer())
	rs.objects = cmInformer.GetIndexer()

	// A namespace that stops matching the selector arrives as a delete:
	// the API server's filtered watch reports it gone.
	if _, err := nsInformer.AddEventHandler(c.enqueueHandler(rs)); err != nil {
		return nil, nil, fmt.Errorf("distribution: namespace informer: %w", err)
	}
	if _, err := cmInformer.AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: c.isOurName,
		Handler:    c.enqueueHandler(rs),
	}); err != nil {
		return nil, nil, fmt.Errorf("distribution: %s informer: %w", c.cfg.Kind, err)
	}
	return nsInformer, cmInformer, nil
}

// enqueueHandler queues the namespace of every added, updated or deleted
// object.
func (c *Controller) enqueueHandler(rs *runState) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueueObject(rs, obj) },
		UpdateFunc: func(_, obj any) { c.enqueueObject(rs, obj) },
		DeleteFunc: func(obj any) { c.enqueueObject(rs, obj) },
	}
}

// followStore renders every trust store change and, when the content
// changed, queues every namespace, until ctx is done. A closed changed
// channel only waits for ctx.
func (c *Controller) followStore(ctx context.Context, rs *runState, changed <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-changed:
			if !ok {
				<-ctx.Done()
				return
			}
			if c.renderCurrent(rs) {
				c.enqueueAll(rs)
			}
		}
	}
}

// renderCurrent renders the store's current snapshot, once per
// generation, and reports whether the content changed. On failure the
// last good content stays.
func (c *Controller) renderCurrent(rs *runState) bool {
	sn := c.cfg.Store.Snapshot()
	cur := rs.content.Load()
	if cur != nil && cur.generation == sn.Generation() {
		return false
	}
	data, skips, err := render(sn, c.cfg.TrustDomain, maxConfigMapBytes)
	if err != nil {
		rs.renderErr.Store(&err)
		c.metrics.renderErrors.Inc()
		c.log.Error("cannot render trust ConfigMap; keeping the last good content",
			"generation", sn.Generation(), logattr.TrustDomain, c.cfg.TrustDomain.Name(), logattr.Error, err)
		return false
	}
	next := &content{generation: sn.Generation(), data: data}
	if err := c.addTruststore(next, cur, sn); err != nil {
		rs.renderErr.Store(&err)
		c.metrics.renderErrors.Inc()
		c.log.Error("cannot render the truststore; keeping the last good content",
			"generation", sn.Generation(), logattr.TrustDomain, c.cfg.TrustDomain.Name(), logattr.Error, err)
		return false
	}
	rs.renderErr.Store(nil)
	for _, s := range skips {
		c.metrics.skipped.WithLabelValues(s.trustDomain, s.reason).Inc()
		c.log.Warn("federated trust domain left out of the trust ConfigMap",
			logattr.TrustDomain, s.trustDomain, "reason", s.reason, logattr.Error, s.err)
	}
	rs.content.Store(next)
	// The truststore follows root-cert.pem: the text keys tell a change.
	return cur == nil || !maps.Equal(cur.data, data)
}

// addTruststore sets next's truststore: cur's while the local roots are
// the same (a new encoding would differ in its salts alone), else a new
// one.
func (c *Controller) addTruststore(next, cur *content, sn *trust.Snapshot) error {
	if c.enc == nil {
		return nil
	}
	if cur != nil && cur.truststore != nil && cur.data[KeyRootCert] == next.data[KeyRootCert] {
		next.truststore, next.roots = cur.truststore, cur.roots
		return nil
	}
	b, _ := sn.Bundle(c.cfg.TrustDomain) // render found it
	p12, roots, err := encodeTruststore(c.enc, b, c.cfg.Truststore.Password)
	if err != nil {
		return err
	}
	next.truststore, next.roots = p12, roots
	return nil
}

func (c *Controller) isOurName(obj any) bool {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := metaOf(obj)
	return err == nil && m.GetName() == c.cfg.Name
}

// enqueueObject queues the namespace a Namespace or ConfigMap event is
// about.
func (c *Controller) enqueueObject(rs *runState, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := metaOf(obj)
	if err != nil {
		c.log.Warn("unexpected informer object", logattr.Error, err)
		return
	}
	ns := m.GetNamespace()
	if _, isNamespace := obj.(*corev1.Namespace); isNamespace {
		ns = m.GetName()
	}
	if ns != "" {
		rs.queue.Add(ns)
	}
}

func metaOf(obj any) (metav1.Object, error) {
	switch o := obj.(type) {
	case *corev1.Namespace:
		return o, nil
	case *corev1.ConfigMap:
		return o, nil
	case *corev1.Secret:
		return o, nil
	default:
		return nil, fmt.Errorf("object of type %T", obj)
	}
}

// enqueueAll queues every namespace the caches know: selected ones for an
// update, and those holding one of our ConfigMaps (which may need
// deleting).
func (c *Controller) enqueueAll(rs *runState) {
	namespaces, _ := rs.nsLister.List(labels.Everything())
	for _, ns := range namespaces {
		rs.queue.Add(ns.Name)
	}
	for _, obj := range rs.objects.List() {
		if o, ok := c.target.decode(obj); ok {
			rs.queue.Add(o.meta.Namespace)
		}
	}
}

func (c *Controller) processNext(ctx context.Context, rs *runState) bool {
	ns, quit := rs.queue.Get()
	if quit {
		return false
	}
	defer rs.queue.Done(ns)
	err := c.reconcile(ctx, rs, ns)
	if err == nil {
		rs.queue.Forget(ns)
		return true
	}
	if ctx.Err() != nil {
		return true
	}
	if te := (*throttledError)(nil); errors.As(err, &te) {
		// Not a failure: the write waits for the pacer, whatever events
		// arrive meanwhile.
		c.metrics.throttled.Inc()
		c.log.Warn("trust ConfigMap rewritten too often; postponing the next write", "namespace", ns,
			"configmap", c.cfg.Name, "delay", te.delay, logattr.Error, err)
		rs.queue.Forget(ns)
		rs.queue.AddAfter(ns, te.delay)
		return true
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		// The cache is behind the API server; the retry sees the newer
		// object.
		c.log.Debug("trust ConfigMap changed under us; retrying", "namespace", ns, logattr.Error, err)
	} else {
		c.log.Warn("cannot reconcile trust ConfigMap; retrying with backoff", "namespace", ns,
			"configmap", c.cfg.Name, logattr.Error, err)
	}
	rs.queue.AddRateLimited(ns)
	return true
}

// wanted reports whether namespace ns should hold our ConfigMap, and
// whether it is terminating (then nothing is done either way: the
// namespace's deletion removes the ConfigMap).
func (c *Controller) wanted(rs *runState, ns string) (want, terminating bool, err error) {
	obj, err := rs.nsLister.Get(ns)
	if apierrors.IsNotFound(err) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	if obj.DeletionTimestamp != nil {
		return false, true, nil
	}
	// The informer already filters by the selector; check again so that
	// the decision never rests on the server having applied it.
	return c.cfg.NamespaceSelector.Matches(labels.Set(obj.Labels)), false, nil
}

func owned(o *object) bool {
	return o.meta.Labels[ManagedByLabel] == ManagedByValue
}

// cached returns the object named ours in namespace ns from the cache,
// nil if there is none.
func (c *Controller) cached(rs *runState, ns string) (*object, error) {
	obj, exists, err := rs.objects.GetByKey(ns + "/" + c.cfg.Name)
	if err != nil || !exists {
		return nil, err
	}
	o, ok := c.target.decode(obj)
	if !ok {
		return nil, fmt.Errorf("unexpected %T in the %s cache", obj, c.cfg.Kind)
	}
	return o, nil
}

// upToDate reports whether o, which we own, holds exactly cur and carries
// the configured labels and annotations.
func (c *Controller) upToDate(o *object, cur *content) bool {
	if o.wrongType || !maps.Equal(o.data, cur.data) || !hasAll(o.meta.Labels, c.cfg.Labels) ||
		!hasAll(o.meta.Annotations, c.cfg.Annotations) {
		return false
	}
	if cur.truststore == nil {
		return len(o.binary) == 0
	}
	p12, ok := o.binary[KeyTruststore]
	return len(o.binary) == 1 && ok && cur.holdsRoots(p12, c.cfg.Truststore.Password)
}

// reconcile brings namespace ns to its desired state from the caches. A
// namespace that no longer matches the selector loses our object: trust
// left behind would never be rotated again, and a root revoked later
// would stay trusted there. An object we do not own is never touched.
func (c *Controller) reconcile(ctx context.Context, rs *runState, ns string) error {
	want, terminating, err := c.wanted(rs, ns)
	if err != nil || terminating {
		return err
	}
	o, err := c.cached(rs, ns)
	if err != nil {
		return err
	}
	if !want {
		if o == nil || !owned(o) {
			return nil
		}
		if err := c.pace(rs, ns); err != nil {
			return err
		}
		return c.delete(ctx, rs, o, "namespace no longer selected")
	}
	return c.distribute(ctx, rs, ns, o)
}

// distribute brings the object of selected namespace ns, o as cached (nil
// if there is none), to the current rendering: it creates it, updates it,
// or replaces it when it cannot be updated (immutable, or a Secret of
// another type). Writes are paced; an object we do not own is left alone.
func (c *Controller) distribute(ctx context.Context, rs *runState, ns string, o *object) error {
	cur := rs.content.Load()
	if cur == nil {
		return nil // nothing rendered yet; the first rendering queues every namespace
	}
	if o == nil || (owned(o) && !c.upToDate(o, cur)) { // a write below
		if err := c.pace(rs, ns); err != nil {
			return err
		}
	}
	switch {
	case o == nil:
		if err := c.write(ctx, rs, ns, nil, cur); err != nil {
			return err
		}
	case !owned(o):
		c.metrics.foreign.Inc()
		c.log.Warn("an object with the trust "+string(c.cfg.Kind)+"'s name exists but is not managed by trustbridge; leaving it alone",
			"namespace", ns, "kind", c.cfg.Kind, "name", c.cfg.Name, "label", ManagedByLabel+"="+ManagedByValue)
		return nil
	case c.upToDate(o, cur):
	case o.immutable || o.wrongType:
		// It cannot be updated, only replaced. Its deletion event brings
		// the namespace back here.
		return c.delete(ctx, rs, o, "immutable or of another type, and out of date; recreating it")
	default:
		if err := c.write(ctx, rs, ns, o, cur); err != nil {
			return err
		}
	}
	c.metrics.lastSync.Set(float64(c.cfg.Clock.Now().UnixNano()) / 1e9)
	return nil
}

// write creates our object in namespace ns holding cur, or, given the
// cached one, updates it. An update carries the cached resourceVersion:
// a concurrent change fails with a conflict and is retried from the
// newer object.
func (c *Controller) write(ctx context.Context, rs *runState, ns string, cached *object, cur *content) error {
	next := &object{meta: metav1.ObjectMeta{Name: c.cfg.Name, Namespace: ns}}
	if cached != nil {
		next.meta = *cached.meta.DeepCopy()
	}
	next.meta.Labels = merged(next.meta.Labels, c.cfg.Labels)
	next.meta.Labels[ManagedByLabel] = ManagedByValue
	next.meta.Annotations = merged(next.meta.Annotations, c.cfg.Annotations)
	next.data = maps.Clone(cur.data)
	if cur.truststore != nil {
		next.binary = map[string][]byte{KeyTruststore: cur.truststore}
	}
	op, result, err := "created", resultCreated, error(nil)
	if cached == nil {
		err = c.target.create(ctx, c.cfg.Client, next)
	} else {
		op, result = "updated", resultUpdated
		err = c.target.update(ctx, c.cfg.Client, next)
	}
	if err != nil {
		return c.writeFailed(err)
	}
	rs.pacer.wrote(ns, c.cfg.Clock.Now())
	c.metrics.writes.WithLabelValues(result).Inc()
	c.log.Info(op+" trust "+string(c.cfg.Kind), "namespace", ns, "name", c.cfg.Name, "generation", cur.generation)
	return nil
}

// pace returns a *throttledError when ns must wait for its next write.
func (c *Controller) pace(rs *runState, ns string) error {
	if d := rs.pacer.wait(ns, c.cfg.Clock.Now()); d > 0 {
		return &throttledError{delay: d}
	}
	return nil
}

func (c *Controller) delete(ctx context.Context, rs *runState, o *object, why string) error {
	uid, rv := o.meta.UID, o.meta.ResourceVersion
	err := c.target.delete(ctx, c.cfg.Client, o.meta.Namespace, o.meta.Name, metav1.DeleteOptions{
		// Delete exactly what we judged: not a newer version someone
		// wrote (perhaps without our label) since.
		Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return c.writeFailed(err)
	}
	rs.pacer.wrote(o.meta.Namespace, c.cfg.Clock.Now())
	c.metrics.writes.WithLabelValues(resultDeleted).Inc()
	c.metrics.lastSync.Set(float64(c.cfg.Clock.Now().UnixNano()) / 1e9)
	c.log.Info("deleted trust "+string(c.cfg.Kind), "namespace", o.meta.Namespace, "name", o.meta.Name, "reason", why)
	return nil
}

func (c *Controller) writeFailed(err error) error {
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		c.metrics.writes.WithLabelValues(resultConflict).Inc()
	} else {
		c.metrics.writes.WithLabelValues(resultError).Inc()
	}
	return err
}

// commonDefaults applies the defaults both controllers share: the resync
// period (refusing a negative one), the clock, a private registry, and a
// logger that discards.
func commonDefaults(resync *time.Duration, clk *clock.PassiveClock, reg *prometheus.Registerer, logger *slog.Logger) (*slog.Logger, error) {
	if *resync < 0 {
		return nil, fmt.Errorf("distribution: resync period must not be negative, got %s", *resync)
	}
	if *resync == 0 {
		*resync = DefaultResync
	}
	if *clk == nil {
		*clk = clock.RealClock{}
	}
	if *reg == nil {
		*reg = prometheus.NewRegistry()
	}
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return logger, nil
}
