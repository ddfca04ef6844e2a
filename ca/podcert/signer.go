package podcert

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	corev1 "k8s.io/api/core/v1"
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

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Authority signs the X509-SVIDs; *ca.Authority implements it.
type Authority interface {
	SignX509SVID(ca.X509SVIDParams) (*ca.Issued, error)
	MaxWorkloadTTL() time.Duration
}

// Outcome is one request's end, for the audit trail.
type Outcome struct {
	Namespace, Request, Pod string
	// Result is "issued", "denied", "failed", or "undecided" when the API
	// server refused the Denied or Failed status itself.
	Result string
	Reason string
	// Message says why, for a denial or failure.
	Message  string
	SPIFFEID spiffeid.ID
	Leaf     *x509.Certificate
}

// Config configures a Signer. Client, SignerName, TrustDomain, Authority
// and Namespaces are required.
type Config struct {
	// Client reads the requests, pods, nodes and service accounts, and
	// writes the requests' status; it needs sign on signers named
	// SignerName (deploy/rbac).
	Client kubernetes.Interface
	// SignerName is the signer pods name in their podCertificate volumes.
	SignerName  string
	TrustDomain spiffeid.TrustDomain
	Authority   Authority
	// Namespaces selects the namespaces whose pods may get certificates;
	// a request from any other is denied (NamespaceNotEnabled).
	Namespaces labels.Selector
	// DNSNames, when set, returns the DNS names of a service account's
	// certificate (--workload-dns-name-template).
	DNSNames func(id spiffeid.ID) []string
	// Identify, when set, gives a pod its identity instead (the identity
	// map node agents are held to): its SPIFFE ID and DNS names. An error
	// wrapping ErrNoIdentity denies the request with its message; any
	// other is retried (rules not read yet).
	Identify func(pod *corev1.Pod) (spiffeid.ID, []string, error)
	// Outcome, when set, is told every request's end (audit trail and
	// issuance ledger).
	Outcome    func(Outcome)
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Resync     time.Duration
	Clock      clock.PassiveClock
	// Workers sign in parallel (default 4).
	Workers int
}

// Signer is trustbridge as a PodCertificateRequest signer: it issues an
// X509-SVID spiffe://<trust domain>/ns/<namespace>/sa/<service account>
// for each pending request naming SignerName whose pod, node and service
// account check out, and sets Issued, Denied or Failed. Run it only on the
// leader.
type Signer struct {
	cfg     Config
	log     *slog.Logger
	results *prometheus.CounterVec
	running atomic.Bool
}

// New checks cfg and registers the metrics; it starts nothing.
func New(cfg Config) (*Signer, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("podcert: no Kubernetes client")
	case cfg.SignerName == "":
		return nil, errors.New("podcert: no signer name")
	case cfg.TrustDomain.IsZero():
		return nil, errors.New("podcert: no trust domain")
	case cfg.Authority == nil:
		return nil, errors.New("podcert: no authority")
	case cfg.Namespaces == nil || cfg.Namespaces.Empty():
		return nil, errors.New("podcert: no namespaces enabled: name them with a label selector (all: kubernetes.io/metadata.name)")
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Minute
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Signer{cfg: cfg, log: log, results: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_pod_certificates_total",
		Help: "PodCertificateRequests of our signer by outcome (issued, denied, failed; undecided when the API server refused the status) and reason.",
	}, []string{"result", "reason"})}
	if err := cfg.Registerer.Register(s.results); err != nil {
		return nil, fmt.Errorf("podcert: register metrics: %w", err)
	}
	return s, nil
}

// Run signs until ctx is done and returns nil once every goroutine it
// started has ended. It may run again (a new leadership term), not twice
// at once.
func (s *Signer) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("podcert: already running")
	}
	defer s.running.Store(false)
	ctx, cancel := context.WithCancel(ctx)
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, time.Minute),
			&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(200), 2000)},
		),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "trustbridge_pod_certificates"},
	)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		queue.ShutDown()
		wg.Wait()
	}()
	inf := certinformers.NewFilteredPodCertificateRequestInformer(s.cfg.Client, metav1.NamespaceAll, s.cfg.Resync, cache.Indexers{},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", s.cfg.SignerName).String()
		})
	lister := certlisters.NewPodCertificateRequestLister(inf.GetIndexer())
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { enqueue(queue, obj) },
		UpdateFunc: func(_, obj any) { enqueue(queue, obj) },
	}); err != nil {
		return fmt.Errorf("podcert: informer: %w", err)
	}
	wg.Go(func() { inf.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	s.log.Info("signing PodCertificateRequests", "signer", s.cfg.SignerName, "namespaces", s.cfg.Namespaces.String())
	for range s.cfg.Workers {
		wg.Go(func() {
			for s.processNext(ctx, queue, lister) {
			}
		})
	}
	<-ctx.Done()
	return nil
}

func enqueue(q workqueue.TypedRateLimitingInterface[string], obj any) {
	if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
		q.Add(key)
	}
}

func (s *Signer) processNext(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], lister certlisters.PodCertificateRequestLister) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	req, err := lister.PodCertificateRequests(ns).Get(name)
	if apierrors.IsNotFound(err) {
		q.Forget(key)
		return true
	}
	if err == nil {
		err = s.handle(ctx, req)
	}
	if err != nil && ctx.Err() == nil {
		s.log.Warn("cannot finish PodCertificateRequest; retrying with backoff", "namespace", ns, "request", name, logattr.Error, err)
		q.AddRateLimited(key)
		return true
	}
	q.Forget(key)
	return true
}

// done reports whether the request already carries its outcome.
func done(req *certv1beta1.PodCertificateRequest) bool {
	for _, c := range req.Status.Conditions {
		switch c.Type {
		case certv1beta1.PodCertificateRequestConditionTypeIssued,
			certv1beta1.PodCertificateRequestConditionTypeDenied,
			certv1beta1.PodCertificateRequestConditionTypeFailed:
			return true
		}
	}
	return false
}

// handle decides one pending request and writes its status. An error is
// transient (the API server), retried with backoff; a refusal is written
// as Denied or Failed.
func (s *Signer) handle(ctx context.Context, req *certv1beta1.PodCertificateRequest) error {
	if done(req) || req.Spec.SignerName != s.cfg.SignerName {
		return nil
	}
	issued, id, err := s.decide(ctx, req)
	var ref *refusal
	switch {
	case errors.As(err, &ref):
		return s.refuse(ctx, req, ref)
	case err != nil:
		return err
	}
	return s.issue(ctx, req, id, issued)
}

// decide checks the request and signs it, or says why not.
func (s *Signer) decide(ctx context.Context, req *certv1beta1.PodCertificateRequest) (*ca.Issued, spiffeid.ID, error) {
	if len(req.Spec.UnverifiedUserAnnotations) > 0 {
		return nil, spiffeid.ID{}, deny(ReasonInvalidAnnotations, "this signer recognises no unverifiedUserAnnotations; remove them from the podCertificate volume")
	}
	if err := s.namespaceEnabled(ctx, req.Namespace); err != nil {
		return nil, spiffeid.ID{}, err
	}
	pub, ref := supportedKey(req.Spec.PKIXPublicKey)
	if ref != nil {
		return nil, spiffeid.ID{}, ref
	}
	if ref := checkProof(pub, string(req.Spec.PodUID), req.Spec.ProofOfPossession); ref != nil {
		return nil, spiffeid.ID{}, ref
	}
	pod, err := s.checkObjects(ctx, req)
	if err != nil {
		return nil, spiffeid.ID{}, err
	}
	ttl, ref := lifetime(req, s.cfg.Authority.MaxWorkloadTTL())
	if ref != nil {
		return nil, spiffeid.ID{}, ref
	}
	id, dnsNames, err := s.identify(pod)
	if err != nil {
		return nil, spiffeid.ID{}, err
	}
	// The CA backdates NotBefore (ca/sign.go) and the API server counts
	// the lifetime from it: ask for that much less.
	issued, err := s.cfg.Authority.SignX509SVID(ca.X509SVIDParams{PublicKey: pub, SPIFFEID: id, TTL: ttl - caBackdate, DNSNames: dnsNames})
	if err != nil {
		return nil, id, &refusal{failed: true, reason: ReasonSignFailed, message: err.Error()}
	}
	if ref := checkIssued(issued.Leaf, ttl); ref != nil {
		return nil, id, ref
	}
	return issued, id, nil
}

func (s *Signer) namespaceEnabled(ctx context.Context, name string) error {
	ns, err := s.cfg.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	if !s.cfg.Namespaces.Matches(labels.Set(ns.Labels)) {
		return deny(ReasonNamespaceNotEnabled, "namespace %s is not enabled for signer %s (its labels do not match %s)", name, s.cfg.SignerName, s.cfg.Namespaces)
	}
	return nil
}

// checkObjects reads the pod, its node and its service account as they
// are now (not from a cache that may lag) and checks the request against
// them. A missing object is a denial, an API error a retry.
func (s *Signer) checkObjects(ctx context.Context, req *certv1beta1.PodCertificateRequest) (*corev1.Pod, error) {
	core := s.cfg.Client.CoreV1()
	pod, err := found(core.Pods(req.Namespace).Get(ctx, req.Spec.PodName, metav1.GetOptions{}))
	if err != nil {
		return nil, err
	}
	node, err := found(core.Nodes().Get(ctx, string(req.Spec.NodeName), metav1.GetOptions{}))
	if err != nil {
		return nil, err
	}
	sa, err := found(core.ServiceAccounts(req.Namespace).Get(ctx, req.Spec.ServiceAccountName, metav1.GetOptions{}))
	if err != nil {
		return nil, err
	}
	if ref := checkPod(req, pod, node, sa, s.cfg.SignerName); ref != nil {
		return nil, ref
	}
	return pod, nil
}

// ErrNoIdentity, wrapped by Config.Identify, says a pod has no identity
// to be given: the request is denied (NoIdentity) with the message.
var ErrNoIdentity = errors.New("no identity for this pod")

// ReasonNoIdentity denies a pod the identity map gives no identity.
const ReasonNoIdentity = "NoIdentity"

// identify is the pod's SPIFFE ID and DNS names: the identity map's when
// one is configured, else spiffe://<td>/ns/<namespace>/sa/<account> and
// the workload DNS name template's.
func (s *Signer) identify(pod *corev1.Pod) (spiffeid.ID, []string, error) {
	if s.cfg.Identify != nil {
		id, dns, err := s.cfg.Identify(pod)
		switch {
		case errors.Is(err, ErrNoIdentity):
			return spiffeid.ID{}, nil, deny(ReasonNoIdentity, "%v", err)
		case err != nil:
			return spiffeid.ID{}, nil, err
		case !id.MemberOf(s.cfg.TrustDomain):
			return spiffeid.ID{}, nil, deny(ReasonNoIdentity, "the identity map gives %s, not of trust domain %s", id, s.cfg.TrustDomain.Name())
		}
		return id, dns, nil
	}
	id, err := spiffeid.FromSegments(s.cfg.TrustDomain, "ns", pod.Namespace, "sa", pod.Spec.ServiceAccountName)
	if err != nil {
		return spiffeid.ID{}, nil, deny(ReasonPodMismatch, "no SPIFFE ID for service account %s/%s: %v", pod.Namespace, pod.Spec.ServiceAccountName, err)
	}
	var dns []string
	if s.cfg.DNSNames != nil {
		dns = s.cfg.DNSNames(id)
	}
	return id, dns, nil
}

// found is o, or nil when the API server says it does not exist.
func found[T *corev1.Pod | *corev1.Node | *corev1.ServiceAccount](o T, err error) (T, error) {
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return o, err
}

// issue writes the chain (the leaf and its intermediates, not the root)
// and the Issued condition.
func (s *Signer) issue(ctx context.Context, req *certv1beta1.PodCertificateRequest, id spiffeid.ID, issued *ca.Issued) error {
	leaf := issued.Leaf // checkIssued made sure there is one
	var chain bytes.Buffer
	for _, c := range issued.Chain[:len(issued.Chain)-len(issued.Roots)] {
		_ = pem.Encode(&chain, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	next := req.DeepCopy()
	nb, na := metav1.NewTime(leaf.NotBefore), metav1.NewTime(leaf.NotAfter)
	refresh := metav1.NewTime(leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2))
	next.Status.CertificateChain = chain.String()
	next.Status.NotBefore, next.Status.NotAfter, next.Status.BeginRefreshAt = &nb, &na, &refresh
	next.Status.Conditions = append(next.Status.Conditions, s.condition(req, certv1beta1.PodCertificateRequestConditionTypeIssued,
		"Issued", "issued "+id.String()+" by trustbridge"))
	if _, err := s.cfg.Client.CertificatesV1beta1().PodCertificateRequests(req.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsInvalid(err) {
			// The API server will never take this chain: say so on the
			// request rather than retry for ever.
			return s.refuse(ctx, req, &refusal{failed: true, reason: ReasonSignFailed, message: "the API server refused the issued chain: " + err.Error()})
		}
		return fmt.Errorf("set Issued: %w", err)
	}
	s.results.WithLabelValues("issued", "Issued").Inc()
	s.log.Info("issued pod certificate", "namespace", req.Namespace, "pod", req.Spec.PodName, logattr.SPIFFEID, id.String(),
		"not_after", leaf.NotAfter)
	s.tell(Outcome{Namespace: req.Namespace, Request: req.Name, Pod: req.Spec.PodName, Result: "issued", Reason: "Issued", SPIFFEID: id, Leaf: leaf})
	return nil
}

// refuse writes Denied or Failed with the refusal's reason and message.
func (s *Signer) refuse(ctx context.Context, req *certv1beta1.PodCertificateRequest, ref *refusal) error {
	typ, result := certv1beta1.PodCertificateRequestConditionTypeDenied, "denied"
	if ref.failed {
		typ, result = certv1beta1.PodCertificateRequestConditionTypeFailed, "failed"
	}
	next := req.DeepCopy()
	next.Status.Conditions = append(next.Status.Conditions, s.condition(req, typ, ref.reason, clip(ref.message)))
	if _, err := s.cfg.Client.CertificatesV1beta1().PodCertificateRequests(req.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsInvalid(err) {
			// Not retried: the same status would be refused again.
			s.log.Error("the API server refuses the request's "+typ+" status; left undecided", "namespace", req.Namespace,
				"request", req.Name, "reason", ref.reason, logattr.Error, err)
			s.results.WithLabelValues("undecided", ref.reason).Inc()
			s.tell(Outcome{Namespace: req.Namespace, Request: req.Name, Pod: req.Spec.PodName, Result: "undecided", Reason: ref.reason,
				Message: clip(ref.message + "; the API server refused this status: " + err.Error())})
			return nil
		}
		return fmt.Errorf("set %s: %w", typ, err)
	}
	s.results.WithLabelValues(result, ref.reason).Inc()
	s.log.Warn("pod certificate "+result, "namespace", req.Namespace, "pod", req.Spec.PodName, "reason", ref.reason, "message", ref.message)
	s.tell(Outcome{Namespace: req.Namespace, Request: req.Name, Pod: req.Spec.PodName, Result: result, Reason: ref.reason, Message: ref.message})
	return nil
}

func (s *Signer) condition(req *certv1beta1.PodCertificateRequest, typ, reason, message string) metav1.Condition {
	return metav1.Condition{
		Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: message,
		ObservedGeneration: req.Generation, LastTransitionTime: metav1.NewTime(s.cfg.Clock.Now()),
	}
}

func (s *Signer) tell(o Outcome) {
	if s.cfg.Outcome != nil {
		s.cfg.Outcome(o)
	}
}
