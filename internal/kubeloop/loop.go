package kubeloop

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
)

// resync is the informer's full relist period, a safety net under the
// watch.
const resync = 10 * time.Minute

// syncKey is the queue's only key: a change to any resource leads to one
// full sync, since the controllers apply the whole set at once and their
// verdicts depend on every resource.
const syncKey = "all"

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
func Run(ctx context.Context, cfg Config) error {
	if cfg.Dynamic == nil || cfg.Sync == nil || cfg.Interval <= 0 {
		return errors.New("kubeloop: Dynamic, Sync and a positive Interval are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	factory := dynamicinformer.NewDynamicSharedInformerFactory(cfg.Dynamic, resync)
	inf := factory.ForResource(cfg.GVR)
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer queue.ShutDown()
	enqueue := func(any) { queue.Add(syncKey) }
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, _ any) { queue.Add(syncKey) }, DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	recorder, stop := newRecorder(ctx, cfg.Events)
	defer stop()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return nil // ctx ended first
	}
	cfg.Logger.Info("watching "+cfg.Kind+" resources", cfg.WatchAttrs...)
	var wg sync.WaitGroup
	wg.Go(func() { work(ctx, cfg, queue, inf.Lister(), recorder) })
	tick(ctx, cfg.Clock, cfg.Interval, queue)
	queue.ShutDown()
	wg.Wait()
	return nil
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
func tick(ctx context.Context, clk clock.WithTicker, interval time.Duration, queue workqueue.TypedInterface[string]) {
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

// work runs Sync for each queued key until the queue shuts down.
func work(ctx context.Context, cfg Config, queue workqueue.TypedRateLimitingInterface[string], l Lister, recorder events.EventRecorder) {
	for {
		key, shutdown := queue.Get()
		if shutdown {
			return
		}
		err := cfg.Sync(ctx, l, recorder)
		if err != nil && ctx.Err() == nil {
			if cfg.SyncErrors != nil {
				cfg.SyncErrors.Inc()
			}
			cfg.Logger.Warn(cfg.Kind+" sync failed; retrying", logattr.Error, err)
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}
