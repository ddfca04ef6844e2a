package broker

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	brokerpb "github.com/spiffe/go-spiffe/v2/exp/proto/spiffe/broker"
	spiretypes "github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Reference is a workload named by a broker, parsed and bounded but not
// yet resolved: the Node verifies that it exists on this node and
// attests it. Exactly one of PID, Pod and Account is set.
type Reference struct {
	// PID is a process of this node (> 0).
	PID int32
	// Pod is a Pod of this node.
	Pod *PodReference
	// Account is a service account: the workload of its running pods on
	// this node (which must all have one identity).
	Account *AccountReference
	// Checks are facts a SPIRE Delegated Identity API caller asserted
	// about the pod beside naming it (k8s:ns, k8s:sa, k8s:pod-label...):
	// each must hold for the pod as attested, or the reference is refused.
	Checks []Check
}

// PodReference names a Pod by UID, by namespace and name, or by both
// (then the pod found by name must have that UID).
type PodReference struct {
	Namespace string
	Name      string
	UID       string
}

// AccountReference names a Kubernetes service account.
type AccountReference struct {
	Namespace string
	Name      string
}

// Check is one asserted fact: Kind is a Workload field name
// ("namespace", "service_account", "pod_name", "pod_uid", "pod_label",
// "node_name"), Key the label's name for "pod_label", Value what it must
// be. Selector is the selector it came from, for messages. ("namespace"
// appears only for a pod named by UID.)
type Check struct {
	Kind, Key, Value string
	Selector         string
}

// String names the reference in logs and errors.
func (r Reference) String() string {
	if r.Account != nil {
		return "service account " + r.Account.Namespace + "/" + r.Account.Name
	}
	if r.Pod == nil {
		return "pid " + strconv.Itoa(int(r.PID))
	}
	switch p := r.Pod; {
	case p.Name != "" && p.UID != "":
		return fmt.Sprintf("pod %s/%s (uid %s)", p.Namespace, p.Name, p.UID)
	case p.Name != "":
		return fmt.Sprintf("pod %s/%s", p.Namespace, p.Name)
	default:
		return "pod uid " + p.UID
	}
}

// ErrInvalidReference is wrapped by every refusal of a reference's form
// (InvalidArgument, WORKLOAD_REFERENCE_INVALID).
var ErrInvalidReference = errors.New("invalid workload reference")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidReference, fmt.Sprintf(format, args...))
}

// Bounds on what a caller may send; every field of a Kubernetes object
// key is far shorter.
const (
	maxReferenceSize = 4 << 10
	maxSelectors     = 32
	maxSelectorSize  = 512
)

// The type URLs of the Broker API's builtin references, as go-spiffe's
// protos name them (package spiffe.broker).
var (
	pidReferenceType = "type.googleapis.com/" + string((&brokerpb.WorkloadPIDReference{}).ProtoReflect().Descriptor().FullName())
	k8sReferenceType = "type.googleapis.com/" + string((&brokerpb.KubernetesObjectReference{}).ProtoReflect().Descriptor().FullName())
)

// The references as SPIRE's broker code and ztunnel's broker client send
// them (package spiffe.reference, spire-api-sdk's newer protos): the PID
// reference has the same field, the Kubernetes one a flat layout of its
// own (spiffeReferenceK8s).
const (
	pidReferenceTypeSPIRE = "type.googleapis.com/spiffe.reference.WorkloadPIDReference"
	k8sReferenceTypeSPIRE = "type.googleapis.com/spiffe.reference.KubernetesObjectReference"
)

// ParseReference parses a SPIFFE Broker API workload reference: a
// WorkloadPIDReference, or a KubernetesObjectReference to a Pod (group
// "core", plural "pods") by UID, namespace and name, or both; each under
// the package name spiffe.broker (go-spiffe) or spiffe.reference (SPIRE,
// ztunnel). Every other
// type, and every other Kubernetes object, is refused naming what is
// served (Broker API §3.1.4: InvalidArgument).
func ParseReference(ref *brokerpb.WorkloadReference) (Reference, error) {
	a := ref.GetReference()
	if a == nil {
		return Reference{}, invalid("the request has no workload reference")
	}
	if len(a.GetValue()) > maxReferenceSize {
		return Reference{}, invalid("the reference is %d bytes; at most %d are accepted", len(a.GetValue()), maxReferenceSize)
	}
	switch a.GetTypeUrl() {
	case pidReferenceType, pidReferenceTypeSPIRE:
		var pid brokerpb.WorkloadPIDReference
		if err := unmarshal(a, &pid); err != nil {
			return Reference{}, err
		}
		if pid.GetPid() <= 0 {
			return Reference{}, invalid("pid %d: a process id must be positive", pid.GetPid())
		}
		return Reference{PID: pid.GetPid()}, nil
	case k8sReferenceType:
		var k brokerpb.KubernetesObjectReference
		if err := unmarshal(a, &k); err != nil {
			return Reference{}, err
		}
		return kubernetesReference(&k)
	case k8sReferenceTypeSPIRE:
		k, err := spiffeReferenceK8s(a.GetValue())
		if err != nil {
			return Reference{}, invalid("%s: %v", a.GetTypeUrl(), err)
		}
		return kubernetesReference(k)
	}
	return Reference{}, invalid("reference type %q is not served; send %s or %s (a Pod)", printable(a.GetTypeUrl()), pidReferenceType, k8sReferenceType)
}

func unmarshal(a *anypb.Any, m proto.Message) error {
	// Discarding unknown fields would let a reference mean less than its
	// sender meant (a field of a newer version, say a container name):
	// refuse it instead.
	if err := (proto.UnmarshalOptions{}).Unmarshal(a.GetValue(), m); err != nil {
		return invalid("%s: %v", a.GetTypeUrl(), err)
	}
	if len(m.ProtoReflect().GetUnknown()) > 0 {
		return invalid("%s: fields this server does not know; it would not know what they ask", a.GetTypeUrl())
	}
	return nil
}

// kubernetesReference is k as a Pod or a ServiceAccount reference.
func kubernetesReference(k *brokerpb.KubernetesObjectReference) (Reference, error) {
	t := k.GetType()
	if len(k.GetKey().ProtoReflect().GetUnknown())+len(t.ProtoReflect().GetUnknown()) > 0 {
		return Reference{}, invalid("Kubernetes object reference: fields this server does not know")
	}
	switch {
	case t.GetPlural() == "serviceaccounts" && t.GetGroup() == "core":
		if k.GetUid() != "" {
			return Reference{}, invalid("a ServiceAccount is referenced by its key (namespace and name) only: this agent does not read service accounts, so it cannot verify a uid")
		}
		if err := checkAccount(k.GetKey().GetNamespace(), k.GetKey().GetName()); err != nil {
			return Reference{}, err
		}
		return Reference{Account: &AccountReference{Namespace: k.GetKey().GetNamespace(), Name: k.GetKey().GetName()}}, nil
	case t.GetPlural() != "pods" || t.GetGroup() != "core":
		return Reference{}, invalid("Kubernetes object type %q in group %q is not served: workloads are referenced as Pods (plural \"pods\", group \"core\"), ServiceAccounts (\"serviceaccounts\", \"core\") or by pid",
			printable(t.GetPlural()), printable(t.GetGroup()))
	}
	p := &PodReference{Namespace: k.GetKey().GetNamespace(), Name: k.GetKey().GetName(), UID: k.GetUid()}
	if k.GetKey() != nil {
		if err := checkKey(p.Namespace, p.Name); err != nil {
			return Reference{}, err
		}
	}
	if p.UID != "" {
		if err := checkUID(p.UID); err != nil {
			return Reference{}, err
		}
	}
	if p.Name == "" && p.UID == "" {
		return Reference{}, invalid("a Pod reference needs its uid, or its key (namespace and name), or both")
	}
	return Reference{Pod: p}, nil
}

// checkKey checks a Pod's namespace and name as Kubernetes would accept
// them: a namespace is a DNS label, a pod name a DNS subdomain.
func checkKey(ns, name string) error {
	if ns == "" || name == "" {
		return invalid("a Pod's key needs both its namespace and its name (Pods are namespaced), got namespace %q, name %q", printable(ns), printable(name))
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return invalid("namespace %q: %s", printable(ns), errs[0])
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return invalid("pod name %q: %s", printable(name), errs[0])
	}
	return nil
}

// checkAccount checks a service account's namespace and name as
// Kubernetes would accept them.
func checkAccount(ns, name string) error {
	if ns == "" || name == "" {
		return invalid("a ServiceAccount's key needs both its namespace and its name, got namespace %q, name %q", printable(ns), printable(name))
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return invalid("namespace %q: %s", printable(ns), errs[0])
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return invalid("service account %q: %s", printable(name), errs[0])
	}
	return nil
}

// checkUID checks a Kubernetes UID: a UUID in its canonical text form, as
// the API server assigns them.
func checkUID(uid string) error {
	if len(uid) != 36 {
		return invalid("uid %q: want a UUID as Kubernetes assigns it (36 characters)", printable(uid))
	}
	for i, c := range uid {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return invalid("uid %q: want a UUID as Kubernetes assigns it", uid)
			}
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
		default:
			return invalid("uid %q: want a UUID as Kubernetes assigns it (lower-case hex)", printable(uid))
		}
	}
	return nil
}

// ParseDelegated parses a SPIRE Delegated Identity API request's
// workload: a pid, or selectors, never both (as SPIRE requires). The
// selectors must name a pod of this node (k8s:pod-uid, or k8s:ns with
// k8s:pod-name) or a service account (k8s:ns with k8s:sa: its running
// pods on this node); the others are facts the pods must have (k8s:sa
// beside a pod, k8s:pod-label, k8s:node-name). A selector that does not
// map onto what trustbridge attests is refused, naming it: a broker never
// chooses an identity by asserting facts, it names pods and the agent
// attests them.
func ParseDelegated(pid int32, selectors []*spiretypes.Selector) (Reference, error) {
	switch {
	case pid != 0 && len(selectors) > 0:
		return Reference{}, invalid("must provide either selectors or non-zero pid, but not both")
	case pid < 0:
		return Reference{}, invalid("pid %d: a process id must be positive", pid)
	case pid > 0:
		return Reference{PID: pid}, nil
	case len(selectors) == 0:
		return Reference{}, invalid("must provide either selectors or non-zero pid")
	case len(selectors) > maxSelectors:
		return Reference{}, invalid("%d selectors; at most %d are accepted", len(selectors), maxSelectors)
	}
	var sel selected
	for _, s := range selectors {
		if err := sel.add(s); err != nil {
			return Reference{}, err
		}
	}
	return sel.reference()
}

// selected is what a Delegated Identity API request's selectors say: the
// pod or service account they name, and the facts they assert.
type selected struct {
	pod     PodReference
	account string
	checks  []Check
}

// add reads one selector.
func (sel *selected) add(s *spiretypes.Selector) error {
	name := s.GetType() + ":" + s.GetValue()
	if len(name) > maxSelectorSize {
		return invalid("a selector of %d bytes; at most %d are accepted", len(name), maxSelectorSize)
	}
	if s.GetType() != "k8s" {
		return invalid("selector %q: only k8s selectors are served (k8s:pod-uid, k8s:ns with k8s:pod-name, k8s:sa, k8s:pod-label, k8s:node-name); %s facts are not attested for a referenced workload", printable(name), printable(s.GetType()))
	}
	kind, value, _ := strings.Cut(s.GetValue(), ":")
	switch kind {
	case "pod-uid":
		return set(&sel.pod.UID, value, name)
	case "ns":
		return set(&sel.pod.Namespace, value, name)
	case "pod-name":
		return set(&sel.pod.Name, value, name)
	case "sa":
		return set(&sel.account, value, name)
	case "node-name":
		sel.checks = append(sel.checks, Check{Kind: "node_name", Value: value, Selector: name})
	case "pod-label":
		k, v, ok := strings.Cut(value, ":")
		if !ok || k == "" {
			return invalid("selector %q: want k8s:pod-label:<name>:<value>", printable(name))
		}
		sel.checks = append(sel.checks, Check{Kind: "pod_label", Key: k, Value: v, Selector: name})
	default:
		return invalid("selector %q does not map onto what trustbridge attests: served are k8s:pod-uid, k8s:ns with k8s:pod-name, k8s:sa, k8s:pod-label and k8s:node-name", printable(name))
	}
	return nil
}

// reference is the pod or service account the selectors name, with the
// facts it must have.
func (sel *selected) reference() (Reference, error) {
	p, checks := sel.pod, sel.checks
	if p.Name == "" && p.UID == "" {
		if p.Namespace == "" || sel.account == "" {
			return Reference{}, invalid("the selectors name no pod and no service account: add k8s:pod-uid:<uid>, k8s:ns:<namespace> with k8s:pod-name:<name>, or k8s:ns:<namespace> with k8s:sa:<service account>; a broker gets the identities of this node's pods, not of facts it asserts")
		}
		if err := checkAccount(p.Namespace, sel.account); err != nil {
			return Reference{}, err
		}
		return Reference{Account: &AccountReference{Namespace: p.Namespace, Name: sel.account}, Checks: checks}, nil
	}
	if sel.account != "" {
		checks = append([]Check{{Kind: "service_account", Value: sel.account, Selector: "k8s:sa:" + sel.account}}, checks...)
	}
	if p.Name == "" && p.Namespace != "" {
		// A pod named by UID: its namespace is a fact to check.
		checks = append(checks, Check{Kind: "namespace", Value: p.Namespace, Selector: "k8s:ns:" + p.Namespace})
		p.Namespace = ""
	}
	if p.Name != "" {
		if err := checkKey(p.Namespace, p.Name); err != nil {
			return Reference{}, err
		}
	}
	if p.UID != "" {
		if err := checkUID(p.UID); err != nil {
			return Reference{}, err
		}
	}
	return Reference{Pod: &p, Checks: checks}, nil
}

// set sets *field to v once: two selectors of one kind that disagree name
// no pod.
func set(field *string, v, selector string) error {
	if *field != "" && *field != v {
		return invalid("selector %q contradicts another selector of its kind", printable(selector))
	}
	*field = v
	return nil
}

// printable is s cut to 128 bytes, for a message (which quotes it with
// %q: control characters are escaped there).
func printable(s string) string {
	if len(s) > 128 {
		return s[:128] + "..."
	}
	return s
}

// spiffeReferenceK8s decodes spiffe.reference.KubernetesObjectReference
// (resource = 1 {plural = 1, group = 2}, namespace = 2, name = 3,
// uid = 4), whose generated code no spire-api-sdk this module can use
// has yet, into go-spiffe's form. Unknown fields are refused, as
// unmarshal does.
func spiffeReferenceK8s(b []byte) (*brokerpb.KubernetesObjectReference, error) {
	k := &brokerpb.KubernetesObjectReference{}
	var key brokerpb.KubernetesObjectKey
	err := eachString(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			k.Type = &brokerpb.KubernetesObjectType{}
			return eachString(v, func(num protowire.Number, v []byte) error {
				switch num {
				case 1:
					k.Type.Plural = string(v)
				case 2:
					k.Type.Group = string(v)
				default:
					return fmt.Errorf("resource: unknown field %d", num)
				}
				return nil
			})
		case 2:
			key.Namespace = string(v)
		case 3:
			key.Name = string(v)
		case 4:
			k.Uid = string(v)
		default:
			return fmt.Errorf("unknown field %d", num)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if key.Namespace != "" || key.Name != "" {
		k.Key = &key
	}
	for _, f := range []string{k.GetType().GetPlural(), k.GetType().GetGroup(), key.Namespace, key.Name, k.Uid} {
		if !utf8.ValidString(f) {
			return nil, errors.New("a string field is not valid UTF-8")
		}
	}
	return k, nil
}

// eachString calls f with each field of the message b, all of which must
// be length-delimited (strings and messages).
func eachString(b []byte, f func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType {
			return fmt.Errorf("field %d: wire type %d, want length-delimited", num, typ)
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, v); err != nil {
			return err
		}
	}
	return nil
}
