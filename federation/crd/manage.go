package crd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/managed"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// ManagerConfig configures a Manager.
type ManagerConfig struct {
	// Dynamic writes the resources.
	Dynamic dynamic.Interface
	// Controller says which resource configures a trust domain.
	Controller *Controller
	// ClassName is written into the resources' spec.className, so that
	// this server's controller takes them.
	ClassName string
	// Local, Reserved: as the Controller's Config.
	Local    spiffeid.TrustDomain
	Reserved map[spiffeid.TrustDomain]string
	// Others are the endpoints applied now (flags, files, resources), the
	// set in which federation.CheckFirstFetch judges a new one.
	Others func() []federation.Endpoint
	// Held, Probe, OnChange: as managed.Config's.
	Held     func(spiffeid.TrustDomain) bool
	Probe    func(context.Context, federation.Endpoint) error
	OnChange func(managed.Change)
}

// Manager is `trustbridge federation add|update|remove` and `bundle set` with
// Kubernetes storage: it writes ClusterFederatedTrustDomain resources,
// which every replica's Controller applies, so the change survives
// restarts and failovers. It refuses what managed.Manager refuses, with
// its errors; a static bundle (no endpoint) has no resource form and is
// refused.
type Manager struct{ cfg ManagerConfig }

// NewManager checks cfg.
func NewManager(cfg ManagerConfig) (*Manager, error) {
	if cfg.Dynamic == nil || cfg.Controller == nil {
		return nil, errors.New("crd: Dynamic and Controller are required")
	}
	if cfg.Others == nil {
		cfg.Others = func() []federation.Endpoint { return nil }
	}
	return &Manager{cfg: cfg}, nil
}

// ResourceName is the name federation add gives td's resource: the
// trust domain's name when it is a valid object name. A trust domain name
// may hold '_' or be longer than an object name may: then the name made
// valid, plus a digest of the trust domain, so that a_b.example and
// a-b.example never share a resource.
func ResourceName(td spiffeid.TrustDomain) string {
	name := td.Name()
	if len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	suffix := hex.EncodeToString(sum[:4])
	clean := strings.Trim(strings.ReplaceAll(name, "_", "-"), ".-")
	if max := validation.DNS1123SubdomainMaxLength - len(suffix) - 1; len(clean) > max {
		clean = strings.TrimRight(clean[:max], ".-")
	}
	if name := clean + "-" + suffix; clean != "" && len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	// Labels the cleaning leaves invalid (a_.example, a..b): the digest
	// alone.
	return "td-" + suffix
}

func (m *Manager) free(td spiffeid.TrustDomain) error {
	return managed.CheckFree(td, m.cfg.Local, m.cfg.Reserved[td])
}

// resourceOf names the resource that configures td, "" when none does.
func (m *Manager) resourceOf(td spiffeid.TrustDomain) string {
	return strings.TrimPrefix(m.cfg.Controller.Origins()[td], "crd:")
}

// Add creates td's resource or, with opts.Force, updates the one that
// configures it.
func (m *Manager) Add(ctx context.Context, ep federation.Endpoint, opts managed.AddOptions) error {
	td := ep.TrustDomain
	if err := m.free(td); err != nil {
		return err
	}
	name := m.resourceOf(td)
	if name != "" && !opts.Force {
		return fmt.Errorf("%w: %s is already federated by ClusterFederatedTrustDomain %s; edit it, or replace it with --force", managed.ErrExists, td.Name(), name)
	}
	if old, ok := m.applied(td); ok && name != "" {
		if err := managed.CheckReplace(old, ep); err != nil {
			return err
		}
	}
	if err := m.check(ctx, ep, opts.NoProbe); err != nil {
		return err
	}
	spec, err := specOf(ep, m.cfg.ClassName)
	if err != nil {
		return err
	}
	kind := managed.KindReplaced
	if name == "" {
		name, kind = ResourceName(td), managed.KindAdded
	}
	if err := m.write(ctx, name, kind == managed.KindAdded, func(_ context.Context, s *Spec) error {
		// --force without --bundle keeps the bootstrap bundle, as with
		// file storage.
		kept := s.TrustDomainBundle
		*s = spec
		if s.TrustDomainBundle == "" {
			s.TrustDomainBundle = kept
		}
		return nil
	}); err != nil {
		return err
	}
	m.changed(managed.Change{Kind: kind, TrustDomain: td, Actor: opts.Actor, EndpointURL: ep.URL.String(), Bundle: ep.BootstrapBundle})
	return nil
}

// applied is td's endpoint as the controller applied it.
func (m *Manager) applied(td spiffeid.TrustDomain) (federation.Endpoint, bool) {
	others := m.cfg.Others()
	if i := slices.IndexFunc(others, func(o federation.Endpoint) bool { return o.TrustDomain == td }); i >= 0 {
		return others[i], true
	}
	return federation.Endpoint{}, false
}

// check is managed.CheckEndpoint of ep among the endpoints applied now
// but the one it replaces.
func (m *Manager) check(ctx context.Context, ep federation.Endpoint, noProbe bool) error {
	others := slices.DeleteFunc(m.cfg.Others(), func(o federation.Endpoint) bool { return o.TrustDomain == ep.TrustDomain })
	anchors := &federation.Anchors{Local: m.cfg.Local, Endpoints: append([]federation.Endpoint{ep}, others...), Held: m.cfg.Held}
	return managed.CheckEndpoint(ctx, ep, anchors, m.cfg.Probe, noProbe)
}

// Update changes the resource that configures td to what edit makes of
// the endpoint its spec configures now, read with the resource and
// written with its resourceVersion: an edit made meanwhile (kubectl edit,
// one the controller has not applied yet or refused) is kept, never
// overwritten; on a conflict the patch is made again on the newer spec.
func (m *Manager) Update(ctx context.Context, td spiffeid.TrustDomain, edit managed.Edit, opts managed.AddOptions) error {
	if err := m.free(td); err != nil {
		return err
	}
	name := m.resourceOf(td)
	if name == "" {
		return fmt.Errorf("%w: no ClusterFederatedTrustDomain of this server configures %s (see trustbridge federation list); add it with trustbridge federation add", managed.ErrNotFound, td.Name())
	}
	p := &patch{m: m, name: name, td: td, edit: edit, noProbe: opts.NoProbe}
	if err := m.write(ctx, name, false, p.apply); err != nil {
		return err
	}
	m.changed(managed.Updated(p.old, p.ep, opts.Actor))
	return nil
}

// patch is one federation update of a resource's spec, made again on
// each read of the resource until one is written.
type patch struct {
	m       *Manager
	name    string
	td      spiffeid.TrustDomain
	edit    managed.Edit
	noProbe bool
	// old is the endpoint of the spec last read and ep the one made of
	// it; checked the spec last checked, not checked (probed) again when
	// a retry makes the same.
	old     federation.Endpoint
	ep      federation.Endpoint
	checked *Spec
}

// apply edits the spec s just read.
func (p *patch) apply(ctx context.Context, s *Spec) error {
	old, _, err := Endpoint(*s)
	if err != nil {
		return fmt.Errorf("%w: ClusterFederatedTrustDomain %s's spec is invalid (%w): fix it with kubectl edit, or replace it with trustbridge federation add --force", managed.ErrInvalid, p.name, err)
	}
	if old.TrustDomain != p.td {
		return fmt.Errorf("%w: ClusterFederatedTrustDomain %s configures %s now, not %s; see trustbridge federation list", managed.ErrNotFound, p.name, old.TrustDomain.Name(), p.td.Name())
	}
	ep, err := p.edit(old)
	if err != nil {
		return fmt.Errorf("%w: %w", managed.ErrInvalid, err)
	}
	if ep.TrustDomain != p.td {
		return fmt.Errorf("%w: an update of %s cannot make it the endpoint of %s", managed.ErrInvalid, p.td.Name(), ep.TrustDomain.Name())
	}
	spec, err := specOf(ep, p.m.cfg.ClassName)
	if err != nil {
		return err
	}
	// A bootstrap bundle the patch leaves as it was (or drops) stays as
	// the resource holds it, byte for byte.
	if ep.BootstrapBundle == nil || (old.BootstrapBundle != nil && ep.BootstrapBundle.Equal(old.BootstrapBundle)) {
		spec.TrustDomainBundle = s.TrustDomainBundle
	}
	if p.checked == nil || !reflect.DeepEqual(*p.checked, spec) {
		if err := p.m.check(ctx, ep, p.noProbe); err != nil {
			return err
		}
		p.checked = &spec
	}
	p.old, p.ep, *s = old, ep, spec
	return nil
}

// Remove deletes the resource that configures td. With Kubernetes
// storage there are no static bundles: opts.BundleOnly is refused.
func (m *Manager) Remove(ctx context.Context, td spiffeid.TrustDomain, opts managed.RemoveOptions) error {
	if err := m.free(td); err != nil {
		return err
	}
	name := m.resourceOf(td)
	if opts.BundleOnly {
		return fmt.Errorf("%w: with --storage kube a bundle set with bundle set is the trustDomainBundle of a ClusterFederatedTrustDomain, never a bundle of its own: stop federating with %s with trustbridge federation remove", managed.ErrInvalid, td.Name())
	}
	if name == "" {
		return fmt.Errorf("%w: no ClusterFederatedTrustDomain of this server configures %s (see trustbridge federation list)", managed.ErrNotFound, td.Name())
	}
	if err := m.cfg.Dynamic.Resource(GVR).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("crd: deleting ClusterFederatedTrustDomain %s: %w", name, err)
	}
	m.changed(managed.Change{Kind: managed.KindRemoved, TrustDomain: td, Actor: opts.Actor})
	return nil
}

// SetBundle sets the trustDomainBundle of the resource that configures
// b's trust domain.
func (m *Manager) SetBundle(ctx context.Context, b *spiffebundle.Bundle, actor string) (string, error) {
	td := b.TrustDomain()
	if err := m.free(td); err != nil {
		return "", err
	}
	name := m.resourceOf(td)
	if name == "" {
		return "", fmt.Errorf("%w: with --storage kube a bundle is set on a trust domain's ClusterFederatedTrustDomain (trustDomainBundle), and none configures %s: add it first with trustbridge federation add", managed.ErrInvalid, td.Name())
	}
	doc, err := bundledoc.Marshal(b)
	if err != nil {
		return "", fmt.Errorf("%w: %w", managed.ErrInvalid, err)
	}
	if err := m.write(ctx, name, false, func(_ context.Context, s *Spec) error {
		s.TrustDomainBundle = string(doc)
		return nil
	}); err != nil {
		return "", err
	}
	m.changed(managed.Change{Kind: managed.KindBootstrap, TrustDomain: td, Actor: actor, Bundle: b})
	return managed.KindBootstrap, nil
}

// write creates the resource name with the spec edit makes or, when
// create is false, edits its spec, again on a conflict: the controller
// writes the status of the same resource meanwhile. A resource created
// meanwhile is an ErrExists.
func (m *Manager) write(ctx context.Context, name string, create bool, edit func(context.Context, *Spec) error) error {
	res := m.cfg.Dynamic.Resource(GVR)
	if create {
		cr := ClusterFederatedTrustDomain{TypeMeta: metav1.TypeMeta{APIVersion: Group + "/" + Version, Kind: Kind}, ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := edit(ctx, &cr.Spec); err != nil {
			return err
		}
		u, err := toUnstructured(&cr)
		if err == nil {
			_, err = res.Create(ctx, u, metav1.CreateOptions{})
		}
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%w: ClusterFederatedTrustDomain %s exists (perhaps for another server's class); edit it, or delete it", managed.ErrExists, name)
		}
		if err != nil {
			return fmt.Errorf("crd: creating ClusterFederatedTrustDomain %s: %w", name, err)
		}
		return nil
	}
	// editErr is edit's refusal, returned as it is.
	var editErr error
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := res.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var cr ClusterFederatedTrustDomain
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &cr); err != nil {
			return err
		}
		if editErr = edit(ctx, &cr.Spec); editErr != nil {
			return editErr
		}
		// The update names the resourceVersion read: a change made
		// since is a conflict, and edit runs again on it.
		u, err := toUnstructured(&cr)
		if err != nil {
			return err
		}
		_, err = res.Update(ctx, u, metav1.UpdateOptions{})
		return err
	})
	switch {
	case editErr != nil:
		return editErr
	case apierrors.IsConflict(err):
		return fmt.Errorf("crd: updating ClusterFederatedTrustDomain %s: it kept changing meanwhile (%w); run the command again", name, err)
	case err != nil:
		return fmt.Errorf("crd: updating ClusterFederatedTrustDomain %s: %w", name, err)
	}
	return nil
}

// toUnstructured is cr without its status, which the controller owns.
func toUnstructured(cr *ClusterFederatedTrustDomain) (*unstructured.Unstructured, error) {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cr)
	if err != nil {
		return nil, err
	}
	unstructured.RemoveNestedField(obj, "status")
	return &unstructured.Unstructured{Object: obj}, nil
}

func (m *Manager) changed(c managed.Change) {
	if m.cfg.OnChange != nil {
		m.cfg.OnChange(c)
	}
}

// specOf is ep as a resource spec, its bootstrap bundle inline.
func specOf(ep federation.Endpoint, className string) (Spec, error) {
	e, err := federation.EntryOf(ep)
	if err != nil {
		return Spec{}, fmt.Errorf("%w: %w", managed.ErrInvalid, err)
	}
	return Spec{
		TrustDomain: e.TrustDomain, BundleEndpointURL: e.BundleEndpointURL,
		BundleEndpointProfile: Profile(e.BundleEndpointProfile), TrustDomainBundle: e.TrustDomainBundle,
		ClassName: className, Refresh: (*RefreshBounds)(e.Refresh),
	}, nil
}
