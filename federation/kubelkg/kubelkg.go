package kubelkg

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/kube/leader/fence"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Names, defaults and limits.
const (
	DefaultPrefix  = "trustbridge-lkg-"
	DefaultTimeout = 10 * time.Second
	DefaultResync  = time.Minute
	// EntryKey is the ConfigMap key holding the entry.
	EntryKey = "entry.json"
	// TrustDomainAnnotation records the trust domain a ConfigMap is for.
	TrustDomainAnnotation = "trustbridge.io/trust-domain"
	// ComponentLabel selects the ConfigMaps of this store.
	ComponentLabel = "trustbridge.io/component"
	component      = "federation-lkg"
	managedByLabel = "app.kubernetes.io/managed-by"
	// MaxEntrySize bounds an entry: a ConfigMap holds at most 1 MiB.
	MaxEntrySize = 1<<20 - 16<<10
	maxNameLen   = 253
	hashLen      = 16
)

// Errors of shared writes.
var (
	// ErrConflict: another writer changed the entry since it was read, or
	// it holds a newer bundle; nothing was written.
	ErrConflict = errors.New("last-known-good changed by another writer")
	// ErrNotLeader: this replica does not lead, so it does not write. It
	// is fence.ErrNotLeader, ca.ErrNotLeader's too.
	ErrNotLeader = fence.ErrNotLeader
)

// Leader says whether this replica leads.
type Leader = fence.Leader

// Config configures a Store. Zero fields take defaults.
type Config struct {
	Client    kubernetes.Interface
	Namespace string
	// Prefix of every ConfigMap name; it must itself be a valid name start.
	Prefix string
	// Leader fences writes; nil means always the leader. If it also has
	// LeadingUntil() time.Time (leader.Elector does), a save still under
	// way at that instant is abandoned.
	Leader  Leader
	Timeout time.Duration
	// Resync is how often Watch reports every entry again, so that a
	// follower whose load after a change failed (the API server blinked)
	// retries it; default DefaultResync.
	Resync time.Duration
	Logger *slog.Logger
}

// Store is a federation.LastKnownGood on ConfigMaps.
type Store struct {
	cfg   Config
	fence fence.Writer // writes: only the leader's, within its lease
}

var _ federation.LastKnownGood = (*Store)(nil)

// New checks cfg; it makes no API call.
func New(cfg Config) (*Store, error) {
	if cfg.Client == nil {
		return nil, errors.New("kubelkg: a Kubernetes client is required")
	}
	if cfg.Namespace == "" {
		return nil, errors.New("kubelkg: a namespace is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if len(cfg.Prefix) > 64 || strings.Trim(sanitize(cfg.Prefix), "-") == "" || sanitize(cfg.Prefix) != cfg.Prefix || cfg.Prefix[0] == '-' {
		return nil, fmt.Errorf("kubelkg: prefix %q: want at most 64 of [a-z0-9-], starting with a letter or digit", cfg.Prefix)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Store{cfg: cfg, fence: fence.Writer{Leader: cfg.Leader, Timeout: cfg.Timeout}}, nil
}

// sanitize maps a trust-domain name onto the characters of one DNS label:
// [a-z0-9] stay, anything else ('.', '_', '-') becomes '-', runs collapse.
func sanitize(s string) string {
	var b strings.Builder
	dash := false
	for _, c := range s {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b.WriteRune(c)
			dash = false
			continue
		}
		if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	return b.String()
}

// Name is the ConfigMap name of td's entry: prefix, readable part, hash
// of the full trust-domain name. It is a valid object name for every
// trust domain, and two trust domains never share one.
func (s *Store) Name(td spiffeid.TrustDomain) string {
	sum := sha256.Sum256([]byte(td.Name()))
	hash := hex.EncodeToString(sum[:])[:hashLen]
	readable := strings.Trim(sanitize(td.Name()), "-")
	if room := maxNameLen - len(s.cfg.Prefix) - 1 - hashLen; len(readable) > room {
		readable = strings.TrimRight(readable[:room], "-")
	}
	if readable == "" {
		return s.cfg.Prefix + hash
	}
	return s.cfg.Prefix + readable + "-" + hash
}

func (s *Store) describe(td spiffeid.TrustDomain) string {
	return "ConfigMap " + s.cfg.Namespace + "/" + s.Name(td)
}

// entry is the stored envelope; the bundle is the canonical document from
// bundledoc.Marshal.
type entry struct {
	TrustDomain string          `json:"trust_domain"`
	EndpointURL string          `json:"endpoint_url,omitempty"`
	ETag        string          `json:"etag,omitempty"`
	FetchedAt   time.Time       `json:"fetched_at"`
	Bundle      json.RawMessage `json:"bundle"`
	// Revoked is federation.MarshalRevoked's; entries written before
	// issue 38 have none.
	Revoked json.RawMessage `json:"revoked,omitempty"`
}

// decode checks a ConfigMap and parses the entry in it for td. The bundle
// goes through bundledoc.Parse, the checks a fetched bundle goes through.
func decode(cm *corev1.ConfigMap, td spiffeid.TrustDomain) (*federation.LKGEntry, error) {
	if got := cm.Annotations[TrustDomainAnnotation]; got != td.Name() {
		return nil, fmt.Errorf("annotation %s is %q, not %q", TrustDomainAnnotation, got, td.Name())
	}
	raw, ok := cm.Data[EntryKey]
	if !ok {
		return nil, fmt.Errorf("%s is missing", EntryKey)
	}
	if len(raw) > MaxEntrySize {
		return nil, fmt.Errorf("%s is %d bytes, more than %d", EntryKey, len(raw), MaxEntrySize)
	}
	var e entry
	if err := json.Unmarshal([]byte(raw), &e); err != nil {
		return nil, fmt.Errorf("%s: %w", EntryKey, err)
	}
	etd, err := bundledoc.TrustDomainName(e.TrustDomain)
	switch {
	case e.TrustDomain == "":
		return nil, fmt.Errorf("%s: trust_domain is missing", EntryKey)
	case err != nil:
		return nil, fmt.Errorf("%s: trust_domain %q: %w", EntryKey, e.TrustDomain, err)
	case etd != td:
		return nil, fmt.Errorf("%s holds the bundle of trust domain %q, not %q", EntryKey, etd.Name(), td.Name())
	case len(e.Bundle) == 0 || string(e.Bundle) == "null":
		return nil, fmt.Errorf("%s: bundle is missing", EntryKey)
	}
	b, err := federation.ParseStoredBundle(td, e.Bundle)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EntryKey, err)
	}
	revoked, err := federation.ParseStoredRevoked(e.Revoked)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EntryKey, err)
	}
	return &federation.LKGEntry{TrustDomain: td, Bundle: b, ETag: e.ETag, EndpointURL: e.EndpointURL, FetchedAt: e.FetchedAt, Revoked: revoked}, nil
}

func (s *Store) get(ctx context.Context, td spiffeid.TrustDomain) (*corev1.ConfigMap, error) {
	cm, err := s.cfg.Client.CoreV1().ConfigMaps(s.cfg.Namespace).Get(ctx, s.Name(td), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return cm, err
}

// Load returns td's entry, or (nil, nil) when there is none. An entry
// that does not check out is an error naming the ConfigMap.
func (s *Store) Load(td spiffeid.TrustDomain) (*federation.LKGEntry, error) {
	if td.IsZero() {
		return nil, errors.New("kubelkg: no trust domain given")
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	cm, err := s.get(ctx, td)
	if err != nil {
		return nil, fmt.Errorf("kubelkg: %s: %w", s.describe(td), err)
	}
	if cm == nil {
		return nil, nil
	}
	e, err := decode(cm, td)
	if err != nil {
		return nil, fmt.Errorf("kubelkg: %s: %w", s.describe(td), err)
	}
	return e, nil
}

// Save replaces e.TrustDomain's entry. It refuses while this replica does
// not lead, when the ConfigMap belongs to another trust domain or holds a
// newer sequence, and when another writer got in first (ErrConflict).
func (s *Store) Save(e federation.LKGEntry) error {
	td := e.TrustDomain
	if td.IsZero() {
		return errors.New("kubelkg: no trust domain given")
	}
	where := s.describe(td)
	if err := s.fence.Check("write"); err != nil {
		return fmt.Errorf("kubelkg: %s: %w", where, err)
	}
	if e.Bundle == nil {
		return fmt.Errorf("kubelkg: %s: no bundle", where)
	}
	if got := e.Bundle.TrustDomain(); got != td {
		return fmt.Errorf("kubelkg: %s: bundle is for trust domain %q", where, got.Name())
	}
	doc, err := bundledoc.Marshal(e.Bundle)
	if err != nil {
		return fmt.Errorf("kubelkg: %s: %w", where, err)
	}
	revoked, err := federation.MarshalRevoked(e.Revoked)
	if err != nil {
		return fmt.Errorf("kubelkg: %s: %w", where, err)
	}
	raw, err := json.Marshal(entry{TrustDomain: td.Name(), EndpointURL: e.EndpointURL, ETag: e.ETag, FetchedAt: e.FetchedAt.UTC(), Bundle: doc, Revoked: revoked})
	if err != nil {
		return fmt.Errorf("kubelkg: %s: %w", where, err)
	}
	if len(raw) > MaxEntrySize {
		return fmt.Errorf("kubelkg: %s: entry of %d bytes is more than the %d a load reads", where, len(raw), MaxEntrySize)
	}
	err = s.fence.Write(func(ctx context.Context) error { return s.save(ctx, e, where, raw) })
	if errors.Is(err, ErrNotLeader) {
		// The fence's refusal; save's own errors name the ConfigMap.
		return fmt.Errorf("kubelkg: %s: %w", where, err)
	}
	return err
}

// Remove deletes td's entry (a trust domain no longer federated: adding
// it again must start from its bootstrap bundle, not these roots); a
// missing one is not an error. Only the leader deletes, like Save; a
// ConfigMap of that name naming another trust domain is left alone.
func (s *Store) Remove(td spiffeid.TrustDomain) error {
	where := s.describe(td)
	if err := s.fence.Check("delete"); err != nil {
		return fmt.Errorf("kubelkg: %s: %w", where, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	cur, err := s.get(ctx, td)
	if err != nil {
		return fmt.Errorf("kubelkg: %s: %w", where, err)
	}
	if cur == nil {
		return nil
	}
	if got := cur.Annotations[TrustDomainAnnotation]; got != td.Name() {
		return fmt.Errorf("kubelkg: %s: belongs to trust domain %q (annotation %s); refusing to delete it", where, got, TrustDomainAnnotation)
	}
	err = s.cfg.Client.CoreV1().ConfigMaps(s.cfg.Namespace).Delete(ctx, cur.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &cur.UID, ResourceVersion: &cur.ResourceVersion},
	})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		return fmt.Errorf("kubelkg: %s: %w: changed while being deleted: %v", where, ErrConflict, err)
	case err != nil:
		return fmt.Errorf("kubelkg: %s: %w", where, err)
	}
	return nil
}

// save writes raw, the encoding of e, as its trust domain's entry,
// refusing to go back in sequence.
func (s *Store) save(ctx context.Context, e federation.LKGEntry, where string, raw []byte) error {
	td := e.TrustDomain
	cms := s.cfg.Client.CoreV1().ConfigMaps(s.cfg.Namespace)
	cur, err := s.get(ctx, td)
	if err != nil {
		return fmt.Errorf("kubelkg: %s: %w", where, err)
	}
	if cur == nil {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{
				Name: s.Name(td), Namespace: s.cfg.Namespace,
				Labels:      map[string]string{managedByLabel: "trustbridge", ComponentLabel: component},
				Annotations: map[string]string{TrustDomainAnnotation: td.Name()},
			},
			Data: map[string]string{EntryKey: string(raw)},
		}
		_, err := cms.Create(ctx, cm, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kubelkg: %s: %w: created by another writer", where, ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("kubelkg: %s: %w", where, err)
		}
		return nil
	}
	if got := cur.Annotations[TrustDomainAnnotation]; got != td.Name() {
		return fmt.Errorf("kubelkg: %s: belongs to trust domain %q (annotation %s); refusing to overwrite it", where, got, TrustDomainAnnotation)
	}
	if old, err := decode(cur, td); err == nil {
		oldSeq, ook := old.Bundle.SequenceNumber()
		ns, nok := e.Bundle.SequenceNumber()
		if ook && nok && ns < oldSeq {
			return fmt.Errorf("kubelkg: %s: %w: it holds sequence %d, newer than %d", where, ErrConflict, oldSeq, ns)
		}
	} else {
		s.cfg.Logger.Warn("replacing an unreadable last-known-good entry", logattr.TrustDomain, td.Name(), logattr.Error, err)
	}
	cur.Data = map[string]string{EntryKey: string(raw)}
	cur.BinaryData = nil
	if cur.Labels == nil {
		cur.Labels = map[string]string{}
	}
	cur.Labels[managedByLabel], cur.Labels[ComponentLabel] = "trustbridge", component
	_, err = cms.Update(ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return fmt.Errorf("kubelkg: %s: %w: %v", where, ErrConflict, err)
	}
	if err != nil {
		return fmt.Errorf("kubelkg: %s: %w", where, err)
	}
	return nil
}

// Watch calls onChange with the trust domain of every entry created,
// changed or deleted (and of each existing one when the watch starts, and
// again every Config.Resync, so a load that failed is retried), until ctx
// is done. Followers pass a function that calls
// Poller.LoadLastKnownGoodFor, which takes only a newer bundle.
func (s *Store) Watch(ctx context.Context, onChange func(spiffeid.TrustDomain)) error {
	sel := labels.SelectorFromSet(labels.Set{ComponentLabel: component}).String()
	cms := s.cfg.Client.CoreV1().ConfigMaps(s.cfg.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return cms.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			return cms.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, s.cfg.Resync, cache.Indexers{})
	// The informer retries on its own; say why it had to, or a follower
	// that cannot list the entries (RBAC, an unreachable API server)
	// would silently keep serving old bundles.
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			s.cfg.Logger.Debug("watch of last-known-good ConfigMaps closed; resuming", logattr.Error, err)
			return
		}
		s.cfg.Logger.Warn("watch of last-known-good ConfigMaps failed; retrying", "namespace", s.cfg.Namespace, logattr.Error, err)
	}); err != nil {
		return fmt.Errorf("kubelkg: %w", err)
	}
	changed := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		td, err := bundledoc.TrustDomainName(cm.Annotations[TrustDomainAnnotation])
		if err != nil || s.Name(td) != cm.Name {
			s.cfg.Logger.Warn("ignoring a last-known-good ConfigMap whose trust-domain annotation does not match its name", "configmap", cm.Name)
			return
		}
		onChange(td)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: changed,
		// Also on a resync (the same resourceVersion): the load that
		// followed the change may have failed.
		UpdateFunc: func(_, newObj any) { changed(newObj) },
		DeleteFunc: changed,
	}); err != nil {
		return fmt.Errorf("kubelkg: %w", err)
	}
	inf.RunWithContext(ctx)
	return nil
}
