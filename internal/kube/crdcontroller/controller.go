package crdcontroller

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/trustbridge/trustbridge/internal/logattr"
)

// resync is the informer's full relist period, a safety net under the
// watch.
const resync = 10 * time.Minute

// syncKey is the queue's only request: a change to any resource leads to
// one full sync, since the controllers apply the whole set at once and
// their verdicts depend on every resource.
var syncKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "all"}}

// Lister is the part of an informer's lister a Sync needs
// (cache.GenericLister has it); tests hand Sync a static one.
type Lister interface {
	List(selector labels.Selector) ([]runtime.Object, error)
}

// SyncFunc applies every listed resource and writes their statuses. The
// recorder is nil when Config.Events is. An error retries the sync with
// backoff.
type SyncFunc func(ctx context.Context, l Lister, recorder events.EventRecorder) error

// Config configures Run.
type Config struct {
	// Dynamic watches GVR. Required.
	Dynamic dynamic.Interface
	GVR     schema.GroupVersionResource
	// Kind names the resource in logs ("ClusterTrustPolicy").
	Kind string
	// WatchAttrs are slog attributes added to the "watching" log line.
	WatchAttrs []any
	// Events, when set, records events (events.k8s.io/v1) as component
	// "trustbridge".
	Events kubernetes.Interface
	// Interval is how often Sync runs with nothing changed. Required.
	Interval time.Duration
	// Sync is called for every change and tick. Required.
	Sync SyncFunc
	// SyncErrors, when set, counts failed syncs (those retried).
	SyncErrors prometheus.Counter
	Clock      clock.WithTicker // nil: the real clock
	Logger     *slog.Logger     // nil: discard
}

// Run watches cfg.GVR and calls cfg.Sync once the cache is synced, after
// every change and every cfg.Interval, until ctx is done; it returns once
// its goroutines have stopped. A Sync that fails is retried with the
// queue's backoff. Run returns nil when ctx ends, even before the cache
// synced, and an error only when it cannot start.
//
// The queue, its worker and the retries are controller-runtime's
// controller, fed by two sources: the dynamic informer on cfg.GVR and a
// ticker on cfg.Clock. It runs unmanaged, inside trustbridge's own
// lifecycle: every replica runs it (only the leader writes, which Sync
// decides), and the cache is waited for here, without a deadline, since
// a missing CRD must leave the server up and saying so, not stop it.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Dynamic == nil || cfg.Sync == nil || cfg.Interval <= 0 {
		return errors.New("crdcontroller: Dynamic, Sync and a positive Interval are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	factory := dynamicinformer.NewDynamicSharedInformerFactory(cfg.Dynamic, resync)
	inf := factory.ForResource(cfg.GVR)
	recorder, stop := newRecorder(ctx, cfg.Events)
	defer stop()
	var tickers sync.WaitGroup
	defer tickers.Wait()
	// Ends the ticker should the controller fail to start.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ctrl, err := newController(cfg, inf, recorder, &tickers)
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return nil // ctx ended first
	}
	cfg.Logger.Info("watching "+cfg.Kind+" resources", cfg.WatchAttrs...)
	return ctrl.Start(ctx)
}

// newController builds the controller that runs syncAll: one request in
// its queue for any change of the resources (the informer) and every
// cfg.Interval (a ticker on cfg.Clock, started with the controller and
// counted in tickers).
func newController(cfg Config, inf informers.GenericInformer, recorder events.EventRecorder, tickers *sync.WaitGroup) (controller.TypedController[reconcile.Request], error) {
	ctrl, err := controller.NewTypedUnmanaged(cmp.Or(cfg.Kind, cfg.GVR.String()), controller.TypedOptions[reconcile.Request]{
		Reconciler: reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			return reconcile.Result{}, syncAll(ctx, cfg, inf.Lister(), recorder)
		}),
		// One controller of a kind per server, but many in one test
		// process: the names need not be unique.
		SkipNameValidation: ptr.To(true),
		// A plain queue with client-go's default controller rate limiter:
		// no priorities, and no queue metrics in controller-runtime's
		// registry, which trustbridge does not serve.
		UsePriorityQueue: ptr.To(false),
		NewQueue: func(_ string, rl workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
			return workqueue.NewTypedRateLimitingQueue(rl)
		},
		// A panic in Sync is a bug: let it crash, as any goroutine's.
		RecoverPanic: ptr.To(false),
		// syncAll logs a failure in the server's words; controller-runtime's
		// own lines ("Reconciler error", "Starting workers") would double
		// them.
		Logger: logr.Discard(),
	})
	if err != nil {
		return nil, err
	}
	enqueue := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{syncKey}
	})
	if err := ctrl.Watch(&source.Informer{Informer: inf.Informer(), Handler: enqueue}); err != nil {
		return nil, err
	}
	if err := ctrl.Watch(source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		tickers.Go(func() { tick(ctx, cfg.Clock, cfg.Interval, q) })
		return nil
	})); err != nil {
		return nil, err
	}
	return ctrl, nil
}

// syncAll runs cfg.Sync, counting and logging a failure; the error makes
// the controller retry with backoff. A failure because ctx ended is
// neither.
func syncAll(ctx context.Context, cfg Config, l Lister, recorder events.EventRecorder) error {
	err := cfg.Sync(ctx, l, recorder)
	if err == nil || ctx.Err() != nil {
		return nil
	}
	if cfg.SyncErrors != nil {
		cfg.SyncErrors.Inc()
	}
	cfg.Logger.Warn(cfg.Kind+" sync failed; retrying", logattr.Error, err)
	return err
}

// newRecorder starts an events broadcaster when client is set; stop
// shuts it down.
func newRecorder(ctx context.Context, client kubernetes.Interface) (events.EventRecorder, func()) {
	if client == nil {
		return nil, func() {}
	}
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	b.StartRecordingToSink(ctx.Done())
	return b.NewRecorder(runtime.NewScheme(), "trustbridge"), b.Shutdown
}

// tick queues a first sync, then one every interval until ctx is done.
func tick(ctx context.Context, clk clock.WithTicker, interval time.Duration, queue workqueue.TypedInterface[reconcile.Request]) {
	t := clk.NewTicker(interval)
	defer t.Stop()
	queue.Add(syncKey)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			queue.Add(syncKey)
		}
	}
}
