package attest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
)

// DefaultPodWait is how long Lookup waits for a pod, or a container
// status, it does not have yet: the kubelet writes a container's ID to
// the pod's status only after the container started, and the watch
// delivers it later still.
const DefaultPodWait = 10 * time.Second

// uidIndex indexes pods by metadata.uid.
const uidIndex = "uid"

// PodsConfig configures Pods.
type PodsConfig struct {
	// Client reads pods; it needs list and watch on pods in every
	// namespace, limited here to the node's.
	Client kubernetes.Interface
	// NodeName is this node's name (spec.nodeName of its pods).
	NodeName string
	// Wait bounds how long a Lookup waits for the pod or container it
	// asks about to appear; default DefaultPodWait.
	Wait time.Duration
	// Clock times Wait; default the real one.
	Clock clock.Clock
	// Logger gets list and watch failures, rate limited; nil discards.
	Logger *slog.Logger
}

// Pods finds callers' pods among those the API server schedules to this
// node, through an informer limited to them (field selector
// spec.nodeName). It is a PodLookup; Run feeds it.
type Pods struct {
	cfg      PodsConfig
	informer cache.SharedIndexInformer
	errLog   *ratelimit.LogLimiter

	mu sync.Mutex
	// keyed are channels closed on the next change of one pod (by UID)
	// or of any pod of one service account (ChangedPod, ChangedAccount).
	keyed map[string]chan struct{}
	// changed is closed, and replaced, on every change to the cache and
	// every list or watch outcome: Lookups waiting for a pod wake on it.
	changed chan struct{}
	// apiErr is the last list or watch failure, nil once one succeeded.
	apiErr error

	// Tests' hooks: missed is called when a Lookup starts waiting,
	// apiFailed after a list or watch failed.
	missed    func()
	apiFailed func()
}

// NewPods returns Pods for cfg; Run starts reading.
func NewPods(cfg PodsConfig) (*Pods, error) {
	if cfg.Client == nil {
		return nil, errors.New("attest: pods: no Kubernetes client")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("attest: pods: no node name")
	}
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultPodWait
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Pods{cfg: cfg, errLog: ratelimit.NewDefaultLogLimiter(), changed: make(chan struct{})}
	// A client that says it cannot stream lists (WatchList), as the fake
	// clientset does, is listed the classic way instead of hanging.
	lw := cache.ToListWatcherWithWatchListSemantics(p.listWatch(), cfg.Client)
	p.informer = cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{uidIndex: podUIDIndex, cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	// Only what Lookup reads is worth keeping for every pod of the node.
	if err := p.informer.SetTransform(func(obj any) (any, error) {
		if pod, ok := obj.(*corev1.Pod); ok {
			pod.ManagedFields = nil
		}
		return obj, nil
	}); err != nil {
		return nil, fmt.Errorf("attest: pods: %w", err)
	}
	if err := p.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		p.observe(err)
	}); err != nil {
		return nil, fmt.Errorf("attest: pods: %w", err)
	}
	notify := func(objs ...any) {
		p.notifyPods(objs...)
		p.notify()
	}
	if _, err := p.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { notify(o) }, DeleteFunc: func(o any) { notify(o) }, UpdateFunc: func(old, o any) { notify(old, o) },
	}); err != nil {
		return nil, fmt.Errorf("attest: pods: %w", err)
	}
	return p, nil
}

// listWatch lists and watches this node's pods, recording each outcome:
// a failure makes Lookup answer Unavailable until a call succeeds.
func (p *Pods) listWatch() *cache.ListWatch {
	sel := fields.OneTermEqualSelector("spec.nodeName", p.cfg.NodeName).String()
	pods := p.cfg.Client.CoreV1().Pods(metav1.NamespaceAll)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = sel
			l, err := pods.List(ctx, opts)
			p.observe(err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = sel
			w, err := pods.Watch(ctx, opts)
			p.observe(err)
			return w, err
		},
	}
}

func podUIDIndex(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, fmt.Errorf("not a pod: %T", obj)
	}
	return []string{string(pod.UID)}, nil
}

// Run reads this node's pods until ctx is done.
func (p *Pods) Run(ctx context.Context) error {
	p.informer.RunWithContext(ctx)
	return nil
}

func (p *Pods) observe(err error) {
	p.mu.Lock()
	p.apiErr = err
	p.mu.Unlock()
	p.notify()
	if err != nil {
		p.cfg.Logger.Log(context.Background(), p.errLog.Level(slog.LevelWarn), "reading this node's pods failed; new callers in pods are refused until it works",
			logattr.Error, err)
		if p.apiFailed != nil {
			p.apiFailed()
		}
	}
}

func (p *Pods) notify() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.changed)
	p.changed = make(chan struct{})
}

// state returns the channel closed on the next change, and why the pods
// cannot be trusted now, if they cannot.
func (p *Pods) state() (<-chan struct{}, error) {
	synced := p.informer.HasSynced() // outside mu: it takes the informer's locks
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !synced && p.apiErr != nil:
		return p.changed, refusal(ErrKubeUnavailable, "node %s's pods not listed yet: %w", p.cfg.NodeName, p.apiErr)
	case !synced:
		return p.changed, refusal(ErrKubeUnavailable, "node %s's pods not listed yet", p.cfg.NodeName)
	case p.apiErr != nil:
		return p.changed, refusal(ErrKubeUnavailable, "node %s's pods cannot be watched: %w", p.cfg.NodeName, p.apiErr)
	}
	return p.changed, nil
}

// Lookup returns the facts of the container containerID in the pod
// podUID, if that pod is on this node. A pod or container not known yet
// is waited for, up to Config.Wait, then refused (ErrUnknownPod,
// ErrUnknownContainer). While the pods cannot be read from the API
// server it answers ErrKubeUnavailable at once, even for pods it knows:
// the agent keeps what it attested before, and guesses nothing new.
func (p *Pods) Lookup(ctx context.Context, podUID, containerID string) (KubernetesFacts, error) {
	return p.await(ctx, "pod "+podUID, func() (KubernetesFacts, error) { return p.find(podUID, containerID) })
}

// await calls find until it finds, waiting for a change after each miss
// up to Config.Wait. ErrPodNotRunning is final: such a pod never runs
// again.
func (p *Pods) await(ctx context.Context, what string, find func() (KubernetesFacts, error)) (KubernetesFacts, error) {
	var timeout <-chan time.Time
	for {
		changed, err := p.state()
		if err != nil {
			return KubernetesFacts{}, err
		}
		k, err := find()
		if err == nil || errors.Is(err, ErrPodNotRunning) {
			return k, err
		}
		if timeout == nil {
			t := p.cfg.Clock.NewTimer(p.cfg.Wait)
			defer t.Stop()
			timeout = t.C()
			if p.missed != nil {
				p.missed()
			}
		}
		select {
		case <-changed:
		case <-timeout:
			return KubernetesFacts{}, err
		case <-ctx.Done():
			return KubernetesFacts{}, fmt.Errorf("attest: waiting for %s: %w", what, ctx.Err())
		}
	}
}

func (p *Pods) find(podUID, containerID string) (KubernetesFacts, error) {
	objs, err := p.informer.GetIndexer().ByIndex(uidIndex, podUID)
	if err != nil {
		return KubernetesFacts{}, fmt.Errorf("attest: %w", err)
	}
	for _, obj := range objs {
		if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.NodeName == p.cfg.NodeName {
			return containerFacts(pod, containerID)
		}
	}
	return KubernetesFacts{}, refusal(ErrUnknownPod, "pod %s is not on node %s", podUID, p.cfg.NodeName)
}

// containerFacts returns the facts of pod's container containerID, found
// by its status (containerID "<runtime>://<id>"): a regular, init or
// ephemeral container. The sandbox has no status and is not found.
func containerFacts(pod *corev1.Pod, containerID string) (KubernetesFacts, error) {
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for _, s := range statuses {
			if _, id, ok := strings.Cut(s.ContainerID, "://"); !ok || id != containerID {
				continue
			}
			k := podFacts(pod)
			k.ContainerID, k.ContainerName, k.Image, k.ImageID = containerID, s.Name, specImage(pod, s.Name), s.ImageID
			return k, nil
		}
	}
	return KubernetesFacts{}, refusal(ErrUnknownContainer, "pod %s/%s (%s) has no container %s in its status", pod.Namespace, pod.Name, pod.UID, containerID)
}

// podFacts are the facts of pod without a container.
func podFacts(pod *corev1.Pod) KubernetesFacts {
	return KubernetesFacts{
		PodUID:         string(pod.UID),
		Namespace:      pod.Namespace,
		PodName:        pod.Name,
		ServiceAccount: pod.Spec.ServiceAccountName,
		Labels:         maps.Clone(pod.Labels),
	}
}

// specImage is the image the pod spec names for container name.
func specImage(pod *corev1.Pod, name string) string {
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for _, c := range cs {
			if c.Name == name {
				return c.Image
			}
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		if c.Name == name {
			return c.Image
		}
	}
	return ""
}
