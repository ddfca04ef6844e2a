package trustpolicy

import (
	"strings"
	"sync"

	"github.com/trustbridge/trustbridge/internal/authn"
)

// LabelSource returns the labels of a Kubernetes service account, and a
// channel closed when any labels change; nil when unknown.
type LabelSource interface {
	Labels(namespace, name string) map[string]string
	Changed() <-chan struct{}
}

// Access decides for authenticated callers (sds.AccessPolicy): the
// current policy of a Cell, the service account labels of a LabelSource
// (optional), and a record of which workloads each rule matched.
type Access struct {
	cell   *Cell
	labels LabelSource
	rec    *recorder

	mu sync.Mutex
	// combined is closed when watchPolicy or watchLabels is: one channel,
	// and one goroutine, per pair of inputs, however many callers wait.
	watchPolicy, watchLabels <-chan struct{}
	combined                 chan struct{}
	closed                   chan struct{} // closed by Close
}

// NewAccess returns an Access over cell; labels may be nil (label
// selectors then match nobody).
func NewAccess(cell *Cell, labels LabelSource) *Access {
	return &Access{cell: cell, labels: labels, rec: newRecorder(), closed: make(chan struct{})}
}

// Close ends the goroutine that merges the policy's and the labels'
// change signals (there is at most one, and it ends by itself on the next
// change). Decide still works afterwards, waiting on policy changes only:
// call Close when the server stops.
func (a *Access) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.closed:
	default:
		close(a.closed)
	}
}

// Decide returns ident's decision under the current policy and a channel
// closed when it may have changed: when the policy changes, or, if the
// policy reads labels and ident proved a service account, when labels
// change. With no policy it returns the zero Decision: everything trusted.
func (a *Access) Decide(ident authn.Identity) (Decision, <-chan struct{}) {
	p, changed := a.cell.Load()
	if p == nil {
		return Decision{}, changed
	}
	sub := SubjectOf(ident)
	if a.labels != nil && p.UsesLabels() && sub.ServiceAccount != "" {
		// The channel first: a change after it was taken closes it.
		labelsChanged := a.labels.Changed()
		sub.Labels = a.labels.Labels(sub.Namespace, sub.ServiceAccount)
		changed = a.merge(changed, labelsChanged)
	}
	d := p.Decide(sub)
	a.rec.record(p, d, sub.ID.String())
	return d, changed
}

// merge returns a channel closed when policy or labels is. The goroutine
// behind it ends when either input closes, which a newer pair of inputs
// implies: at most one waits at any time.
func (a *Access) merge(policy, labels <-chan struct{}) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.closed:
		return policy
	default:
	}
	if a.combined != nil && a.watchPolicy == policy && a.watchLabels == labels {
		return a.combined
	}
	out := make(chan struct{})
	a.watchPolicy, a.watchLabels, a.combined = policy, labels, out
	closed := a.closed
	go func() {
		select {
		case <-policy:
		case <-labels:
		case <-closed:
		}
		close(out)
	}()
	return out
}

// Matched is what the rule named rule matched recently.
func (a *Access) Matched(rule string) MatchedWorkloads { return a.rec.matched(rule) }

// SubjectOf is the Subject of an authenticated identity: its SPIFFE ID,
// and the service account it proved (token, or the grant recorded in its
// X509-SVID). A pod's namespace alone gives the namespace. Labels are
// left to the caller (Access reads them from its LabelSource).
func SubjectOf(ident authn.Identity) Subject {
	sub := Subject{ID: ident.ID}
	if g := ident.Grant; g != nil && g.Method == authn.MethodKubernetesJWT {
		ns, sa, ok := strings.Cut(g.Ref, "/")
		if ok && ns != "" && sa != "" {
			sub.Namespace, sub.ServiceAccount = ns, sa
			return sub
		}
	}
	sub.Namespace = ident.Pod.Namespace
	return sub
}
