package attest

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// PodRef names a pod, as a broker names a workload by its Kubernetes Pod:
// by UID, or by namespace and name, or by all three. Every field given
// must match the pod.
type PodRef struct {
	Namespace string
	Name      string
	UID       string
}

// String names the pod for messages.
func (r PodRef) String() string {
	switch {
	case r.Name == "":
		return "pod " + r.UID
	case r.UID == "":
		return "pod " + r.Namespace + "/" + r.Name
	default:
		return "pod " + r.Namespace + "/" + r.Name + " (" + r.UID + ")"
	}
}

func (r PodRef) matches(pod *corev1.Pod) bool {
	return (r.UID == "" || pod.UID == types.UID(r.UID)) &&
		(r.Namespace == "" || pod.Namespace == r.Namespace) &&
		(r.Name == "" || pod.Name == r.Name)
}

// LookupPod returns the facts of the pod ref names, without a container
// (ContainerID, ContainerName, Image and ImageID empty), if that pod is on
// this node. It waits for a pod it does not know yet, and answers
// ErrKubeUnavailable while the pods cannot be read, as Lookup does.
//
// Refusals: a ref with neither a UID nor a namespace and name wraps
// ErrInvalidPodRef; a pod not on this node (within Config.Wait), or one
// found by name whose UID is not ref's (re-created since), wraps
// ErrUnknownPod; a pod terminating (its deletion requested) or finished
// (phase Succeeded or Failed) wraps ErrPodNotRunning, at once: it gets no
// new identity. A pod not started yet (Pending) is found: a broker sets
// up a pod's traffic before its containers run.
func (p *Pods) LookupPod(ctx context.Context, ref PodRef) (KubernetesFacts, error) {
	if ref.UID == "" && (ref.Namespace == "" || ref.Name == "") {
		return KubernetesFacts{}, refusal(ErrInvalidPodRef, "namespace %q, name %q, uid %q: name a pod by its UID, or by its namespace and name",
			ref.Namespace, ref.Name, ref.UID)
	}
	return p.await(ctx, ref.String(), func() (KubernetesFacts, error) { return p.findPod(ref) })
}

// ChangedPod returns a channel closed at the next change of the pod with
// that UID (its update, its deletion): a stream serving a pod reference
// looks it up again then, and not on every other pod's change. Whether
// the pods can be read does not close it: a stream keeps what it
// resolved through an outage. Take it before the lookup it guards, so that
// a change in between is not missed.
func (p *Pods) ChangedPod(uid string) <-chan struct{} { return p.keyedChannel("uid:" + uid) }

// ChangedAccount is ChangedPod for every pod of a service account: one
// added, changed or deleted.
func (p *Pods) ChangedAccount(namespace, serviceAccount string) <-chan struct{} {
	return p.keyedChannel(accountKey(namespace, serviceAccount))
}

func accountKey(namespace, serviceAccount string) string {
	return "sa:" + namespace + "/" + serviceAccount
}

func (p *Pods) keyedChannel(key string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keyed == nil {
		p.keyed = make(map[string]chan struct{})
	}
	ch, ok := p.keyed[key]
	if !ok {
		ch = make(chan struct{})
		p.keyed[key] = ch
	}
	return ch
}

// notifyPods closes the channels of objs' pods and service accounts
// (an update passes the old and the new pod: a pod whose account
// changed concerns both).
func (p *Pods) notifyPods(objs ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, obj := range objs {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			continue
		}
		for _, key := range []string{"uid:" + string(pod.UID), accountKey(pod.Namespace, pod.Spec.ServiceAccountName)} {
			if ch, ok := p.keyed[key]; ok {
				close(ch)
				delete(p.keyed, key)
			}
		}
	}
}

func (p *Pods) findPod(ref PodRef) (KubernetesFacts, error) {
	pod, err := p.podByRef(ref)
	if err != nil {
		return KubernetesFacts{}, err
	}
	switch {
	case pod.DeletionTimestamp != nil:
		return KubernetesFacts{}, refusal(ErrPodNotRunning, "pod %s/%s (%s) on node %s is terminating (deletion requested at %s): no new identity for it",
			pod.Namespace, pod.Name, pod.UID, p.cfg.NodeName, pod.DeletionTimestamp.UTC().Format(time.RFC3339))
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return KubernetesFacts{}, refusal(ErrPodNotRunning, "pod %s/%s (%s) on node %s has finished (phase %s): no new identity for it",
			pod.Namespace, pod.Name, pod.UID, p.cfg.NodeName, pod.Status.Phase)
	}
	return podFacts(pod), nil
}

// podByRef finds ref's pod among this node's: by namespace and name where
// ref has them, else by UID.
func (p *Pods) podByRef(ref PodRef) (*corev1.Pod, error) {
	idx := p.informer.GetIndexer()
	var objs []any
	if ref.Namespace != "" && ref.Name != "" {
		obj, ok, err := idx.GetByKey(ref.Namespace + "/" + ref.Name)
		if err != nil {
			return nil, fmt.Errorf("attest: %w", err)
		}
		if ok {
			objs = []any{obj}
		}
	} else {
		var err error
		if objs, err = idx.ByIndex(uidIndex, ref.UID); err != nil {
			return nil, fmt.Errorf("attest: %w", err)
		}
	}
	for _, obj := range objs {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Spec.NodeName != p.cfg.NodeName {
			continue
		}
		if !ref.matches(pod) {
			return nil, refusal(ErrUnknownPod, "%s is not on node %s: the pod there is %s/%s (%s) (re-created since the reference was taken?)",
				ref, p.cfg.NodeName, pod.Namespace, pod.Name, pod.UID)
		}
		return pod, nil
	}
	return nil, refusal(ErrUnknownPod, "%s is not on node %s", ref, p.cfg.NodeName)
}

// PodsOf returns the facts of this node's running pods of service account
// serviceAccount in namespace (not terminating, not finished), without a
// container, as LookupPod gives them: the pods a broker means when it
// names a workload by namespace and service account (SPIRE's k8s:ns and
// k8s:sa selectors). None is not an error. It answers ErrKubeUnavailable
// while the pods cannot be read, and does not wait.
func (p *Pods) PodsOf(namespace, serviceAccount string) ([]KubernetesFacts, error) {
	if _, err := p.state(); err != nil {
		return nil, err
	}
	objs, err := p.informer.GetIndexer().ByIndex(cache.NamespaceIndex, namespace)
	if err != nil {
		return nil, fmt.Errorf("attest: %w", err)
	}
	var out []KubernetesFacts
	for _, obj := range objs {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Spec.NodeName != p.cfg.NodeName || pod.Spec.ServiceAccountName != serviceAccount ||
			pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		out = append(out, podFacts(pod))
	}
	return out, nil
}
