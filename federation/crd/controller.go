package crd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/kube/crdcontroller"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// DefaultStatusInterval is Config.StatusInterval's default.
const DefaultStatusInterval = 10 * time.Second

// Config configures a Controller.
type Config struct {
	// Dynamic reads the resources and writes their status.
	Dynamic dynamic.Interface
	// Events, when set, records events (events.k8s.io/v1) on refused
	// resources; cluster-scoped objects' events land in namespace default.
	Events kubernetes.Interface
	// LocalTrustDomain is the server's own: a resource for it is refused.
	LocalTrustDomain spiffeid.TrustDomain
	// Reserved are trust domains configured by flag or file, with where:
	// a resource for one of them is a conflict.
	Reserved map[spiffeid.TrustDomain]string
	// Static are the endpoints flags and files configure (the trust
	// domains of Reserved): with the resources, the set in which
	// federation.CheckFirstFetch judges a resource served by another
	// trust domain.
	Static []federation.Endpoint
	// Held reports whether a bundle of a trust domain is held (the
	// poller's Holds): a self-serving https_spiffe resource without
	// trustDomainBundle is valid only then (federation.CheckFirstFetch).
	// Nil means none is.
	Held func(spiffeid.TrustDomain) bool
	// ClassName: resources whose spec.className is set and differs are
	// ignored (spire-controller-manager's semantics).
	ClassName string
	// Apply receives the full set of endpoints the resources configure,
	// after every change.
	Apply func([]federation.Endpoint) error
	// Status reports the poller's view, copied into each resource's status.
	Status func() []federation.Status
	// IsLeader: only the leader writes status and events; nil means
	// always. Every replica applies the resources, so a new leader polls
	// the same set at once.
	IsLeader       func() bool
	StatusInterval time.Duration
	Clock          clock.WithTicker
	Logger         *slog.Logger
	Registerer     prometheus.Registerer
}

// Controller turns ClusterFederatedTrustDomain resources into federation
// endpoints and reports each one's polling state in its status.
type Controller struct {
	cfg     Config
	metrics *crdcontroller.Metrics

	mu sync.Mutex
	// valid is the last valid endpoint of each resource by name, with
	// the generation it came from: an edit that makes a resource invalid
	// leaves its last valid spec applied.
	valid   map[string]validSpec
	origins map[spiffeid.TrustDomain]string
	// refused records, per resource, the refusal last reported as an
	// event, so each is reported once per generation.
	refused map[string]string
}

type validSpec struct {
	ep         federation.Endpoint
	generation int64
}

// New checks cfg; it starts nothing.
func New(cfg Config) (*Controller, error) {
	if cfg.Dynamic == nil || cfg.Apply == nil || cfg.Status == nil {
		return nil, errors.New("crd: Dynamic, Apply and Status are required")
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = DefaultStatusInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("crd: %w", err)
	}
	return &Controller{cfg: cfg, metrics: m, valid: map[string]validSpec{}, origins: map[spiffeid.TrustDomain]string{}, refused: map[string]string{}}, nil
}

// Origins names, for each trust domain a resource configures, that
// resource ("crd:<name>").
func (c *Controller) Origins() map[spiffeid.TrustDomain]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.origins)
}

// Run watches the resources until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	err := crdcontroller.Run(ctx, crdcontroller.Config{
		Dynamic: c.cfg.Dynamic, GVR: GVR, Kind: "ClusterFederatedTrustDomain", WatchAttrs: []any{"class", c.cfg.ClassName},
		Events: c.cfg.Events, Interval: c.cfg.StatusInterval, Sync: c.sync, SyncErrors: c.metrics.SyncErrors,
		Clock: c.cfg.Clock, Logger: c.cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("crd: %w", err)
	}
	return nil
}

// resource is a listed object, decoded.
type resource struct {
	obj *unstructured.Unstructured
	cr  ClusterFederatedTrustDomain
	err error // decoding failed
}

// sync applies every resource and updates statuses.
func (c *Controller) sync(ctx context.Context, l crdcontroller.Lister, recorder events.EventRecorder) error {
	objs, err := l.List(labels.Everything())
	if err != nil {
		return err
	}
	rs := c.decode(objs)

	c.mu.Lock()
	j := judge(rs, c.valid, c.cfg.LocalTrustDomain, c.cfg.Reserved, c.cfg.Static, c.cfg.Held)
	for name := range c.valid {
		if _, ok := j.valid[name]; !ok {
			delete(c.refused, name) // deleted resource: its endpoint goes
		}
	}
	c.valid, c.origins = j.valid, j.origins
	c.mu.Unlock()

	if err := c.cfg.Apply(j.endpoints); err != nil {
		// The endpoints were validated one by one; a refusal here is a
		// bug, and the poller keeps its previous set.
		return fmt.Errorf("applying %d endpoints: %w", len(j.endpoints), err)
	}
	states := make([]string, len(j.verdicts))
	for i, v := range j.verdicts {
		states[i] = v.state()
	}
	c.metrics.SetStates(states)
	if c.cfg.IsLeader != nil && !c.cfg.IsLeader() {
		return nil
	}
	statuses := map[string]federation.Status{}
	for _, s := range c.cfg.Status() {
		statuses[s.TrustDomain] = s
	}
	var errs []error
	for i, r := range rs {
		v := j.verdicts[i]
		c.report(r, v, recorder)
		if err := c.writeStatus(ctx, r, v, statuses); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// decode keeps the listed resources of this server's class, decoded (a
// resource that does not decode is kept, with its error), oldest first:
// the oldest resource for a trust domain wins a conflict.
func (c *Controller) decode(objs []runtime.Object) []resource {
	var rs []resource
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		r := resource{obj: u}
		r.err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r.cr)
		if r.err == nil && c.cfg.ClassName != "" && r.cr.Spec.ClassName != "" && r.cr.Spec.ClassName != c.cfg.ClassName {
			continue
		}
		if r.err == nil && c.cfg.ClassName == "" && r.cr.Spec.ClassName != "" {
			continue // a class for another server
		}
		rs = append(rs, r)
	}
	slices.SortFunc(rs, func(a, b resource) int {
		return cmp.Or(a.obj.GetCreationTimestamp().Compare(b.obj.GetCreationTimestamp().Time), cmp.Compare(a.obj.GetName(), b.obj.GetName()))
	})
	return rs
}

// judgment is what judge decided about a set of resources.
type judgment struct {
	verdicts  []verdict // one per resource, in order
	valid     map[string]validSpec
	endpoints []federation.Endpoint
	origins   map[spiffeid.TrustDomain]string
}

// judge decides, without side effects, what each resource (oldest first)
// applies: its spec if valid, else its last valid one from valid (which it
// does not change), unless another source already configures the trust
// domain (reserved, or an older resource). federation.CheckFirstFetch
// judges each resource in the set of static (the flags' and files'
// endpoints) and every resource's spec, oldest first, with local's roots
// and held (may be nil). The judgment's valid map holds the present
// resources only, so a deleted resource's endpoint goes.
func judge(rs []resource, valid map[string]validSpec, local spiffeid.TrustDomain, reserved map[spiffeid.TrustDomain]string,
	static []federation.Endpoint, held func(spiffeid.TrustDomain) bool) judgment {
	j := judgment{
		verdicts: make([]verdict, len(rs)),
		valid:    map[string]validSpec{},
		origins:  map[spiffeid.TrustDomain]string{},
	}
	specs := make([]parsedSpec, len(rs))
	// The set: static endpoints first, as they win a trust domain over any
	// resource, then the resources oldest first, as the oldest claims it.
	// CheckFirstFetch counts the first endpoint of a trust domain only; if
	// that one is refused, a younger one that takes its place is not
	// counted, which can refuse, never wrongly accept.
	anchors := &federation.Anchors{Local: local, Endpoints: slices.Clone(static), Held: held}
	for i, r := range rs {
		if r.err == nil {
			p := &specs[i]
			if p.ep, p.warnings, p.err = Endpoint(r.cr.Spec); p.err == nil && p.ep.TrustDomain != local {
				anchors.Endpoints = append(anchors.Endpoints, p.ep)
			}
		}
	}
	claimed := map[spiffeid.TrustDomain]string{}
	for i, r := range rs {
		name := r.obj.GetName()
		v := &j.verdicts[i]
		if v.reason, v.msg = specs[i].refusal(r, local, anchors); v.reason == "" {
			v.warnings = specs[i].warnings
			j.valid[name] = validSpec{ep: specs[i].ep, generation: r.obj.GetGeneration()}
		}
		vs, ok := j.valid[name]
		if !ok {
			vs, ok = valid[name]
		}
		if !ok {
			continue
		}
		j.valid[name] = vs
		td := vs.ep.TrustDomain
		switch where, isReserved := reserved[td]; {
		case isReserved:
			v.conflict = fmt.Sprintf("trust domain %s is already configured by %s; remove one of the two", td.Name(), where)
		case claimed[td] != "":
			v.conflict = fmt.Sprintf("trust domain %s is already configured by ClusterFederatedTrustDomain %s, which is older", td.Name(), claimed[td])
		default:
			claimed[td] = name
			v.applied, v.ep, v.generation = true, vs.ep, vs.generation
		}
	}
	for _, v := range j.verdicts {
		if v.applied {
			j.endpoints = append(j.endpoints, v.ep)
			j.origins[v.ep.TrustDomain] = "crd:" + claimed[v.ep.TrustDomain]
		}
	}
	return j
}

// parsedSpec is a resource's spec as Endpoint parsed it.
type parsedSpec struct {
	ep       federation.Endpoint
	warnings []string
	err      error
}

// refusal says why resource r, whose spec parsed as p, is invalid
// (ReasonInvalidSpec and a message), or "" when it is valid.
func (p parsedSpec) refusal(r resource, local spiffeid.TrustDomain, anchors *federation.Anchors) (reason, msg string) {
	switch {
	case r.err != nil:
		return ReasonInvalidSpec, "spec does not decode: " + r.err.Error()
	case p.err != nil:
		return ReasonInvalidSpec, p.err.Error()
	case p.ep.TrustDomain == local:
		return ReasonInvalidSpec, fmt.Sprintf("%s is this server's own trust domain; its bundle comes from the CA", p.ep.TrustDomain.Name())
	}
	if err := federation.CheckFirstFetch(p.ep, anchors); err != nil {
		return ReasonInvalidSpec, err.Error()
	}
	return "", ""
}

// verdict is what sync decided about one resource.
type verdict struct {
	reason, msg string // refused spec (the current generation)
	conflict    string
	warnings    []string
	applied     bool
	ep          federation.Endpoint
	generation  int64 // of the applied spec
}

func (v verdict) state() string {
	switch {
	case v.conflict != "":
		return "conflict"
	case v.reason != "" && v.applied:
		return "invalid_last_valid_applied"
	case v.reason != "":
		return "invalid"
	}
	return "applied"
}

// report logs and records an event for a refusal, once per generation.
func (c *Controller) report(r resource, v verdict, recorder events.EventRecorder) {
	name := r.obj.GetName()
	var reason, note string
	switch {
	case v.reason != "":
		reason, note = v.reason, v.msg
		if v.applied {
			note += fmt.Sprintf("; generation %d stays applied", v.generation)
		}
	case v.conflict != "":
		reason, note = ReasonConflict, v.conflict
	default:
		delete(c.refused, name)
		return
	}
	if crdcontroller.Refused(c.refused, recorder, r.obj, reason, note) {
		c.cfg.Logger.Warn("ClusterFederatedTrustDomain refused", "name", name, "reason", reason, logattr.Error, note)
	}
}

// writeStatus updates r's status when it differs from what it should be.
func (c *Controller) writeStatus(ctx context.Context, r resource, v verdict, statuses map[string]federation.Status) error {
	want := Status{ObservedGeneration: r.obj.GetGeneration()}
	old := r.cr.Status
	set := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		crdcontroller.SetCondition(&want.Conditions, old.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg,
			ObservedGeneration: want.ObservedGeneration}, c.cfg.Clock.Now())
	}
	switch {
	case v.conflict != "":
		want.State = StateInvalid
		set(ConditionReady, metav1.ConditionFalse, ReasonConflict, v.conflict)
	case v.reason != "" && !v.applied:
		want.State = StateInvalid
		set(ConditionReady, metav1.ConditionFalse, v.reason, v.msg)
	default:
		st, ok := statuses[v.ep.TrustDomain.Name()]
		if !ok {
			st = federation.Status{State: federation.StatePending, EndpointURL: v.ep.URL.String()}
		}
		fillStatus(&want, st)
		ready, reason, msg := metav1.ConditionFalse, ReasonPending, "no bundle fetched yet"
		switch st.State {
		case federation.StateOK:
			ready, reason, msg = metav1.ConditionTrue, ReasonFetched, "bundle fetched and trusted"
		case federation.StateFailing:
			reason, msg = ReasonFailing, "polls fail; the last good bundle is kept: "+st.LastError
		case federation.StateStale:
			reason, msg = ReasonStale, "no successful poll for 3 refresh intervals; the last good bundle is kept: "+st.LastError
		}
		if v.reason != "" {
			ready, reason = metav1.ConditionFalse, v.reason
			msg = fmt.Sprintf("%s; generation %d stays applied", v.msg, v.generation)
		} else if len(v.warnings) > 0 {
			msg += "; warnings: " + fmt.Sprint(v.warnings)
		}
		set(ConditionReady, ready, reason, msg)
		if st.State == federation.StateStale {
			set(ConditionStale, metav1.ConditionTrue, ReasonStale, "no successful poll for 3 refresh intervals")
		} else {
			set(ConditionStale, metav1.ConditionFalse, ReasonFresh, "polled within its refresh intervals, or not yet due")
		}
	}
	if reflect.DeepEqual(normalize(old), normalize(want)) {
		return nil
	}
	written, err := crdcontroller.UpdateStatus(ctx, c.cfg.Dynamic.Resource(GVR), r.obj, &want)
	if err != nil {
		return fmt.Errorf("status of %s: %w", r.obj.GetName(), err)
	}
	if written {
		c.metrics.StatusWrites.Inc()
	}
	return nil
}

// fillStatus copies the poller's view of a trust domain into s.
func fillStatus(s *Status, st federation.Status) {
	s.State, s.EndpointURL, s.LastError, s.ConsecutiveFailures = string(st.State), st.EndpointURL, crdcontroller.Truncate(st.LastError, 4000), st.ConsecutiveFailures
	if st.Sequence != nil && *st.Sequence <= 1<<63-1 {
		seq := int64(*st.Sequence)
		s.Sequence = &seq
	}
	s.LastAttempt, s.LastSuccess, s.NextRefresh = metaTime(st.LastAttempt), metaTime(st.LastSuccess), metaTime(st.NextRefresh)
	for _, a := range st.Authorities {
		s.Authorities = append(s.Authorities, Authority{Kind: string(a.Kind), SHA256: a.SHA256, Subject: a.Subject, KeyID: a.KeyID, NotAfter: metaTime(a.NotAfter)})
	}
}

// metaTime is t at the second precision the API server stores.
func metaTime(t *time.Time) *metav1.Time {
	if t == nil {
		return nil
	}
	m := metav1.NewTime(t.UTC().Truncate(time.Second))
	return &m
}

// normalize makes two statuses comparable after a round trip through the
// API server (UTC, seconds, nil vs empty slices).
func normalize(s Status) Status {
	s = *s.DeepCopy()
	for _, t := range []*metav1.Time{s.LastAttempt, s.LastSuccess, s.NextRefresh} {
		if t != nil {
			*t = metav1.NewTime(t.UTC().Truncate(time.Second))
		}
	}
	for i := range s.Conditions {
		s.Conditions[i].LastTransitionTime = metav1.NewTime(s.Conditions[i].LastTransitionTime.UTC().Truncate(time.Second))
	}
	for i := range s.Authorities {
		if t := s.Authorities[i].NotAfter; t != nil {
			*t = metav1.NewTime(t.UTC().Truncate(time.Second))
		}
	}
	if len(s.Authorities) == 0 {
		s.Authorities = nil
	}
	if len(s.Conditions) == 0 {
		s.Conditions = nil
	}
	return s
}

// DeepCopy copies s.
func (s Status) DeepCopy() *Status {
	out := s
	cp := func(t *metav1.Time) *metav1.Time {
		if t == nil {
			return nil
		}
		c := *t
		return &c
	}
	out.LastAttempt, out.LastSuccess, out.NextRefresh = cp(s.LastAttempt), cp(s.LastSuccess), cp(s.NextRefresh)
	if s.Sequence != nil {
		v := *s.Sequence
		out.Sequence = &v
	}
	out.Authorities = make([]Authority, len(s.Authorities))
	for i, a := range s.Authorities {
		a.NotAfter = cp(a.NotAfter)
		out.Authorities[i] = a
	}
	out.Conditions = slices.Clone(s.Conditions)
	return &out
}
