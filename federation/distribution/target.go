package distribution

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Kind is the kind of object the controller keeps in every selected
// namespace.
type Kind string

// The kinds a Controller distributes to.
const (
	// KindConfigMap: text keys in data, the truststore in binaryData.
	KindConfigMap Kind = "ConfigMap"
	// KindSecret: an Opaque Secret, every key in data.
	KindSecret Kind = "Secret"
)

// object is a distributed ConfigMap or Secret as the controller judges
// it: its metadata and its keys, text ones apart from binary ones.
type object struct {
	meta   metav1.ObjectMeta
	data   map[string]string
	binary map[string][]byte
	// immutable objects cannot be updated, only replaced.
	immutable bool
	// wrongType is a Secret of a type other than Opaque: the type cannot
	// be changed, so it is replaced.
	wrongType bool
}

// target is what differs between the kinds: the informer, and turning
// objects to and from their API form.
type target interface {
	informer(client kubernetes.Interface, resync time.Duration, name string) cache.SharedIndexInformer
	// decode returns the object an informer holds, ok false for anything
	// else.
	decode(obj any) (o *object, ok bool)
	create(ctx context.Context, client kubernetes.Interface, o *object) error
	update(ctx context.Context, client kubernetes.Interface, o *object) error
	delete(ctx context.Context, client kubernetes.Interface, ns, name string, opts metav1.DeleteOptions) error
}

func targetFor(k Kind) (target, error) {
	switch k {
	case KindConfigMap:
		return configMapTarget{}, nil
	case KindSecret:
		return secretTarget{}, nil
	default:
		return nil, fmt.Errorf("kind %q: want %s or %s", k, KindConfigMap, KindSecret)
	}
}

// byName keeps an informer's cache to the objects named name; it also lets
// RBAC restrict list and watch to that one name.
func byName(name string) func(*metav1.ListOptions) {
	return func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
	}
}

var namespaceIndex = cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}

type configMapTarget struct{}

func (configMapTarget) informer(client kubernetes.Interface, resync time.Duration, name string) cache.SharedIndexInformer {
	return coreinformers.NewFilteredConfigMapInformer(client, metav1.NamespaceAll, resync, namespaceIndex, byName(name))
}

func (configMapTarget) decode(obj any) (*object, bool) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return nil, false
	}
	return &object{
		meta: *cm.ObjectMeta.DeepCopy(), data: cm.Data, binary: cm.BinaryData,
		immutable: cm.Immutable != nil && *cm.Immutable,
	}, true
}

func (configMapTarget) encode(o *object) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: o.meta, Data: maps.Clone(o.data)}
	if len(o.binary) > 0 {
		cm.BinaryData = maps.Clone(o.binary)
	}
	return cm
}

func (t configMapTarget) create(ctx context.Context, client kubernetes.Interface, o *object) error {
	_, err := client.CoreV1().ConfigMaps(o.meta.Namespace).Create(ctx, t.encode(o), metav1.CreateOptions{})
	return err
}

func (t configMapTarget) update(ctx context.Context, client kubernetes.Interface, o *object) error {
	_, err := client.CoreV1().ConfigMaps(o.meta.Namespace).Update(ctx, t.encode(o), metav1.UpdateOptions{})
	return err
}

func (configMapTarget) delete(ctx context.Context, client kubernetes.Interface, ns, name string, opts metav1.DeleteOptions) error {
	return client.CoreV1().ConfigMaps(ns).Delete(ctx, name, opts)
}

type secretTarget struct{}

func (secretTarget) informer(client kubernetes.Interface, resync time.Duration, name string) cache.SharedIndexInformer {
	return coreinformers.NewFilteredSecretInformer(client, metav1.NamespaceAll, resync, namespaceIndex, byName(name))
}

// decode splits a Secret's data: the truststore is binary, every other key
// is text.
func (secretTarget) decode(obj any) (*object, bool) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return nil, false
	}
	o := &object{
		meta:      *s.ObjectMeta.DeepCopy(),
		immutable: s.Immutable != nil && *s.Immutable,
		wrongType: s.Type != corev1.SecretTypeOpaque && s.Type != "",
	}
	for k, v := range s.Data {
		if k == KeyTruststore {
			o.binary = map[string][]byte{k: v}
			continue
		}
		if o.data == nil {
			o.data = map[string]string{}
		}
		o.data[k] = string(v)
	}
	return o, true
}

func (secretTarget) encode(o *object) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: o.meta, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{}}
	for k, v := range o.data {
		s.Data[k] = []byte(v)
	}
	for k, v := range o.binary {
		s.Data[k] = v
	}
	return s
}

func (t secretTarget) create(ctx context.Context, client kubernetes.Interface, o *object) error {
	_, err := client.CoreV1().Secrets(o.meta.Namespace).Create(ctx, t.encode(o), metav1.CreateOptions{})
	return err
}

func (t secretTarget) update(ctx context.Context, client kubernetes.Interface, o *object) error {
	_, err := client.CoreV1().Secrets(o.meta.Namespace).Update(ctx, t.encode(o), metav1.UpdateOptions{})
	return err
}

func (secretTarget) delete(ctx context.Context, client kubernetes.Interface, ns, name string, opts metav1.DeleteOptions) error {
	return client.CoreV1().Secrets(ns).Delete(ctx, name, opts)
}
