package kubestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/kube/leader/fence"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Defaults and limits.
const (
	DefaultName    = "trustbridge-ca"
	DefaultTimeout = 10 * time.Second
	// MaxSecretSize bounds what Load accepts: the API server's own limit
	// for a Secret.
	MaxSecretSize = 1 << 20
	// ManagedByLabel marks the Secrets trustbridge writes.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	managedBy      = "trustbridge"
)

// Config configures a Store. Zero fields take defaults.
type Config struct {
	Client    kubernetes.Interface
	Namespace string
	// Name of the Secret; default trustbridge-ca.
	Name string
	// Leader fences writes: while it does not lead, Commit refuses with
	// castate.ErrNotLeader. nil means always the leader (a single replica). If
	// it also has LeadingUntil() time.Time (leader.Elector does), a write
	// still under way at that instant is abandoned.
	Leader castate.Leader
	// Timeout bounds each API call.
	Timeout time.Duration
	Logger  *slog.Logger
}

// Store is a castate.Backend on one Secret.
type Store struct {
	cfg   Config
	fence fence.Writer // writes: only the leader's, within its lease
	mu    sync.RWMutex // Lock: this process's readers and writers
}

var _ castate.Backend = (*Store)(nil)

// New checks cfg; it makes no API call.
func New(cfg Config) (*Store, error) {
	if cfg.Client == nil {
		return nil, errors.New("kubestore: a Kubernetes client is required")
	}
	if cfg.Namespace == "" {
		return nil, errors.New("kubestore: a namespace is required")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Store{cfg: cfg, fence: fence.Writer{Leader: cfg.Leader, Timeout: cfg.Timeout}}, nil
}

// Describe names the Secret.
func (s *Store) Describe() string { return "Secret " + s.cfg.Namespace + "/" + s.cfg.Name }

func (s *Store) wrap(err error) error { return fmt.Errorf("kubestore: %s: %w", s.Describe(), err) }

func corrupt(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{castate.ErrCorruptState}, a...)...)
}

// Lock serializes this process's users of the Store; other replicas are
// kept apart by the leader fence and optimistic concurrency.
func (s *Store) Lock(exclusive bool) (func(), error) {
	if exclusive {
		s.mu.Lock()
		return s.mu.Unlock, nil
	}
	s.mu.RLock()
	return s.mu.RUnlock, nil
}

func (s *Store) get() (*corev1.Secret, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	sec, err := s.cfg.Client.CoreV1().Secrets(s.cfg.Namespace).Get(ctx, s.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, s.wrap(err)
	}
	return sec, nil
}

// Version is the Secret's resourceVersion, "" when there is none.
func (s *Store) Version() (string, error) {
	sec, err := s.get()
	if err != nil || sec == nil {
		return "", err
	}
	return sec.ResourceVersion, nil
}

// Load reads and checks the state. A missing Secret, or one without data
// (created empty by an operator), is no state.
func (s *Store) Load(td string) (*castate.Journal, []*castate.Root, []*castate.JWTKey, string, error) {
	sec, err := s.get()
	if err != nil || sec == nil {
		return nil, nil, nil, "", err
	}
	st, err := decode(sec, td)
	if err != nil {
		return nil, nil, nil, "", s.wrap(err)
	}
	if st == nil {
		// An empty Secret an operator created: no state, but a version to
		// update it at.
		return nil, nil, nil, sec.ResourceVersion, nil
	}
	return st.journal, st.roots, st.jwtKeys, sec.ResourceVersion, nil
}

// state is what a Secret holds.
type state struct {
	journal *castate.Journal
	roots   []*castate.Root
	jwtKeys []*castate.JWTKey
}

// decode checks a Secret and parses the state in it; nil is none.
func decode(sec *corev1.Secret, td string) (*state, error) {
	if sec.Type != "" && sec.Type != corev1.SecretTypeOpaque {
		return nil, corrupt("type is %q, not %q", sec.Type, corev1.SecretTypeOpaque)
	}
	size := 0
	for k, v := range sec.Data {
		size += len(k) + len(v)
	}
	for k, v := range sec.StringData {
		size += len(k) + len(v)
	}
	if size > MaxSecretSize {
		return nil, corrupt("%d bytes of data, more than %d", size, MaxSecretSize)
	}
	if len(sec.Data) == 0 {
		return nil, nil
	}
	data, ok := sec.Data[castate.JournalKey]
	if !ok {
		return nil, corrupt("%s is missing but %s exist; refusing to start over and orphan them", castate.JournalKey, strings.Join(sortedKeys(sec.Data), ", "))
	}
	j, err := castate.DecodeJournal(data, td)
	if err != nil {
		return nil, err
	}
	named := map[string]bool{castate.JournalKey: true}
	st := &state{journal: j}
	if st.roots, err = decodeRoots(sec.Data, j, named); err != nil {
		return nil, err
	}
	if st.jwtKeys, err = decodeJWTKeys(sec.Data, j, named); err != nil {
		return nil, err
	}
	for _, k := range sortedKeys(sec.Data) {
		if !named[k] {
			// Commits replace the whole state at once, so nothing is ever
			// left over: someone else edited the Secret.
			return nil, corrupt("key %q is not part of the CA state", k)
		}
	}
	return st, nil
}

// decodeRoots parses the roots j names, adding their keys to named.
func decodeRoots(data map[string][]byte, j *castate.Journal, named map[string]bool) ([]*castate.Root, error) {
	roots := make([]*castate.Root, 0, len(j.Roots))
	for _, rec := range j.Roots {
		ck, kk := castate.RootCertKey(rec.ID), castate.RootKeyKey(rec.ID)
		named[ck], named[kk] = true, true
		certPEM, ok1 := data[ck]
		keyPEM, ok2 := data[kk]
		if !ok1 || (!ok2 && rec.KeyRef == "") {
			return nil, corrupt("root %s: %s or %s is missing", rec.ID, ck, kk)
		}
		r, err := castate.DecodeRoot(rec, certPEM, keyPEM)
		if err != nil {
			return nil, err
		}
		roots = append(roots, r)
	}
	return roots, nil
}

// decodeJWTKeys parses the JWT keys j names, adding their keys to named.
func decodeJWTKeys(data map[string][]byte, j *castate.Journal, named map[string]bool) ([]*castate.JWTKey, error) {
	keys := make([]*castate.JWTKey, 0, len(j.JWTKeys))
	for _, rec := range j.JWTKeys {
		kk := castate.JWTKeyKey(rec.KID)
		named[kk] = true
		keyPEM, ok := data[kk]
		if !ok && rec.KeyRef == "" {
			return nil, corrupt("JWT key %s: %s is missing", rec.KID, kk)
		}
		k, err := castate.DecodeJWTKey(rec, keyPEM)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Commit writes the whole state if the Secret is still at version base.
func (s *Store) Commit(base string, j *castate.Journal, roots []*castate.Root, jwtKeys []*castate.JWTKey) (string, error) {
	if err := s.fence.Check("write"); err != nil {
		return "", s.wrap(err)
	}
	data, err := encode(j, roots, jwtKeys)
	if err != nil {
		return "", s.wrap(err)
	}
	size := 0
	for k, v := range data {
		size += len(k) + len(v)
	}
	if size > MaxSecretSize {
		return "", s.wrap(fmt.Errorf("state of %d bytes is more than a Secret holds (%d)", size, MaxSecretSize))
	}
	var version string
	err = s.fence.Write(func(ctx context.Context) error {
		version, err = s.commit(ctx, base, data)
		return err
	})
	if err != nil {
		return "", s.wrap(err)
	}
	return version, nil
}

// encode is the Secret data of the state: the journal, and the material
// of exactly the roots and JWT keys it names.
func encode(j *castate.Journal, roots []*castate.Root, jwtKeys []*castate.JWTKey) (map[string][]byte, error) {
	if len(j.Roots) != len(roots) {
		return nil, fmt.Errorf("journal names %d roots, %d given", len(j.Roots), len(roots))
	}
	if len(j.JWTKeys) != len(jwtKeys) {
		return nil, fmt.Errorf("journal names %d JWT keys, %d given", len(j.JWTKeys), len(jwtKeys))
	}
	data := make(map[string][]byte, 1+2*len(roots)+len(jwtKeys))
	jb, err := castate.EncodeJournal(j)
	if err != nil {
		return nil, err
	}
	data[castate.JournalKey] = jb
	for i, r := range roots {
		if r.ID != j.Roots[i].ID {
			return nil, fmt.Errorf("journal root %d is %s, material is for %s", i, j.Roots[i].ID, r.ID)
		}
		certPEM, keyPEM, err := castate.EncodeRoot(r)
		if err != nil {
			return nil, err
		}
		data[castate.RootCertKey(r.ID)] = certPEM
		if keyPEM != nil { // nil: the key is in a key manager (KeyRef)
			data[castate.RootKeyKey(r.ID)] = keyPEM
		}
	}
	for i, k := range jwtKeys {
		if k.KID != j.JWTKeys[i].KID {
			return nil, fmt.Errorf("journal JWT key %d is %s, material is for %s", i, j.JWTKeys[i].KID, k.KID)
		}
		keyPEM, err := castate.EncodeJWTKey(k)
		if err != nil {
			return nil, err
		}
		if keyPEM != nil {
			data[castate.JWTKeyKey(k.KID)] = keyPEM
		}
	}
	return data, nil
}

func (s *Store) commit(ctx context.Context, base string, data map[string][]byte) (string, error) {
	secrets := s.cfg.Client.CoreV1().Secrets(s.cfg.Namespace)
	if base == "" {
		sec := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: s.cfg.Name, Namespace: s.cfg.Namespace, Labels: map[string]string{ManagedByLabel: managedBy}},
			Type:       corev1.SecretTypeOpaque,
			Data:       data,
		}
		created, err := secrets.Create(ctx, sec, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("%w: created by another writer", castate.ErrConflict)
		}
		if err != nil {
			return "", err
		}
		return created.ResourceVersion, nil
	}
	// Read-modify-write on the object as it stands, so labels and
	// annotations others set survive; the resourceVersion check makes the
	// whole of it atomic.
	cur, err := secrets.Get(ctx, s.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("%w: deleted since it was read", castate.ErrConflict)
	}
	if err != nil {
		return "", err
	}
	if cur.ResourceVersion != base {
		return "", fmt.Errorf("%w: resourceVersion %s, read at %s", castate.ErrConflict, cur.ResourceVersion, base)
	}
	cur.Data, cur.StringData = data, nil
	if cur.Labels == nil {
		cur.Labels = map[string]string{}
	}
	cur.Labels[ManagedByLabel] = managedBy
	updated, err := secrets.Update(ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return "", fmt.Errorf("%w: %v", castate.ErrConflict, err)
	}
	if err != nil {
		return "", err
	}
	return updated.ResourceVersion, nil
}

// Watch calls onChange whenever the Secret is created, changed or
// deleted, and once when the watch starts, until ctx is done. Followers
// pass their Authority's Recheck, so they reload as soon as the leader
// writes. The watch's cache keeps no key material: only metadata.
func (s *Store) Watch(ctx context.Context, onChange func()) error {
	sel := fields.OneTermEqualSelector("metadata.name", s.cfg.Name).String()
	secrets := s.cfg.Client.CoreV1().Secrets(s.cfg.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return secrets.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return secrets.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.Secret{}, 0, cache.Indexers{})
	if err := inf.SetTransform(metadataOnly); err != nil {
		return s.wrap(err)
	}
	// The informer retries on its own; say why it had to, or a follower
	// that cannot list the Secret (RBAC, an unreachable API server) would
	// silently stop noticing the leader's writes until its next recheck.
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			s.cfg.Logger.Debug("watch of the CA state closed; resuming", "secret", s.cfg.Namespace+"/"+s.cfg.Name, logattr.Error, err)
			return
		}
		s.cfg.Logger.Warn("watch of the CA state failed; retrying", "secret", s.cfg.Namespace+"/"+s.cfg.Name, logattr.Error, err)
	}); err != nil {
		return s.wrap(err)
	}
	changed := func(event string) {
		s.cfg.Logger.Debug("CA state Secret changed", "event", event, "secret", s.cfg.Namespace+"/"+s.cfg.Name)
		onChange()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { changed("add") },
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Secret)
			n, ok2 := newObj.(*corev1.Secret)
			if ok1 && ok2 && o.ResourceVersion == n.ResourceVersion {
				return // a relist, nothing new
			}
			changed("update")
		},
		DeleteFunc: func(any) { changed("delete") },
	}); err != nil {
		return s.wrap(err)
	}
	onChange()
	inf.RunWithContext(ctx)
	return nil
}

// metadataOnly is the watch's transform: what it keeps of a Secret, before
// caching it.
// That is the identity and version of the object, never its data nor
// annotations or managed fields, which may quote it (kubectl apply keeps
// the whole applied object in an annotation).
func metadataOnly(obj any) (any, error) {
	if sec, ok := obj.(*corev1.Secret); ok {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
			Name: sec.Name, Namespace: sec.Namespace, UID: sec.UID, ResourceVersion: sec.ResourceVersion,
		}, Type: sec.Type}, nil
	}
	return obj, nil
}
