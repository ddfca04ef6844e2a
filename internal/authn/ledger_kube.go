package authn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// KubeLedger defaults and limits.
const (
	// DefaultLedgerSecret names the Secret of a KubeLedger.
	DefaultLedgerSecret = "trustbridge-bootstrap-tokens"
	// DefaultLedgerTimeout bounds each API call.
	DefaultLedgerTimeout = 10 * time.Second
	// maxLedgerSecretSize keeps the Secret under the API server's 1 MiB
	// limit for an object, metadata included: about 8,000 consumptions.
	maxLedgerSecretSize = 1<<20 - 64<<10
	ledgerManagedBy     = "trustbridge"
	ledgerManagedLabel  = "app.kubernetes.io/managed-by"
)

// ledgerRetry is how often Consume reads again after another replica
// changed the Secret between its read and its write.
var ledgerRetry = wait.Backoff{Steps: 8, Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.2}

// KubeLedgerConfig configures NewKubeLedger.
type KubeLedgerConfig struct {
	Client    kubernetes.Interface
	Namespace string
	// Name of the Secret; default DefaultLedgerSecret.
	Name string
	// Timeout bounds each API call; default DefaultLedgerTimeout.
	Timeout time.Duration
}

// KubeLedger is a TokenLedger in one Secret that every replica shares, the
// way the CA state is kept (ca/kubestore): data key = the token's
// reference, value = {"spiffe_id", "consumed_at"}. Consume reads the
// Secret and writes it back with the resourceVersion it read, so when two
// replicas consume at once the API server refuses the second write
// (Conflict); that replica reads again, finds the token consumed and
// refuses. Every replica writes, leader or not: each issues certificates.
//
// Consumed references are cached: a consumption is never undone, so an
// answer of "consumed" never goes stale, and a caller repeating a spent
// token costs no API call.
type KubeLedger struct {
	cfg KubeLedgerConfig

	mu    sync.Mutex
	known map[string]Consumption
}

var _ TokenLedger = (*KubeLedger)(nil)

// NewKubeLedger checks cfg; it makes no API call.
func NewKubeLedger(cfg KubeLedgerConfig) (*KubeLedger, error) {
	if cfg.Client == nil {
		return nil, errors.New("authn: consumed-token ledger: a Kubernetes client is required")
	}
	if cfg.Namespace == "" {
		return nil, errors.New("authn: consumed-token ledger: a namespace is required")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultLedgerSecret
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultLedgerTimeout
	}
	return &KubeLedger{cfg: cfg, known: map[string]Consumption{}}, nil
}

// Describe names the Secret.
func (k *KubeLedger) Describe() string { return "Secret " + k.cfg.Namespace + "/" + k.cfg.Name }

func (k *KubeLedger) wrap(err error) error {
	return fmt.Errorf("authn: consumed-token ledger %s: %w", k.Describe(), err)
}

func (k *KubeLedger) cached(ref string) (Consumption, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, ok := k.known[ref]
	return c, ok
}

func (k *KubeLedger) remember(c Consumption) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.known[c.Ref] = c
}

// get reads the Secret; nil when there is none yet.
func (k *KubeLedger) get(ctx context.Context) (*corev1.Secret, error) {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.Timeout)
	defer cancel()
	sec, err := k.cfg.Client.CoreV1().Secrets(k.cfg.Namespace).Get(ctx, k.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if sec.Type != "" && sec.Type != corev1.SecretTypeOpaque {
		return nil, fmt.Errorf("type is %q, not %q; it is not a ledger trustbridge wrote", sec.Type, corev1.SecretTypeOpaque)
	}
	return sec, nil
}

// Consumed reports whether ref is a key of the Secret. A key whose value
// does not parse still counts as consumed: someone edited the Secret, and
// the safe reading of a record that a token was spent is that it was.
func (k *KubeLedger) Consumed(ctx context.Context, ref string) (Consumption, bool, error) {
	if c, ok := k.cached(ref); ok {
		return c, true, nil
	}
	sec, err := k.get(ctx)
	if err != nil {
		return Consumption{}, false, k.wrap(err)
	}
	if sec == nil {
		return Consumption{}, false, nil
	}
	raw, ok := sec.Data[ref]
	if !ok {
		return Consumption{}, false, nil
	}
	c := decodeKubeEntry(ref, raw)
	k.remember(c)
	return c, true, nil
}

// decodeKubeEntry reads a Secret value; what does not parse leaves the
// record with the reference only.
func decodeKubeEntry(ref string, raw []byte) Consumption {
	var e ledgerEntry
	if err := json.Unmarshal(raw, &e); err == nil {
		if c, err := e.consumption(ref); err == nil {
			return c
		}
	}
	return Consumption{Ref: ref}
}

// Consume adds c.Ref to the Secret, creating it on the first consumption,
// with optimistic concurrency: a write refused because another replica
// wrote first (Conflict, AlreadyExists) is retried on a fresh read, which
// then finds the token consumed if that replica consumed the same one.
func (k *KubeLedger) Consume(ctx context.Context, c Consumption) error {
	if err := checkConsumption(c); err != nil {
		return k.wrap(err)
	}
	if _, ok := k.cached(c.Ref); ok {
		return k.wrap(fmt.Errorf("reference %s: %w", c.Ref, ErrTokenConsumed))
	}
	value, err := json.Marshal(entryOf(c))
	if err != nil {
		return k.wrap(err)
	}
	racing := func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }
	err = retry.OnError(ledgerRetry, racing, func() error { return k.consumeOnce(ctx, c, value) })
	if racing(err) {
		return k.wrap(fmt.Errorf("the Secret kept changing under %d attempts; retry: %w", ledgerRetry.Steps, err))
	}
	if err != nil && !errors.Is(err, ErrTokenConsumed) {
		return k.wrap(err)
	}
	return err
}

// consumeOnce is one read and one conditional write.
func (k *KubeLedger) consumeOnce(ctx context.Context, c Consumption, value []byte) error {
	sec, err := k.get(ctx)
	if err != nil {
		return err
	}
	if sec == nil {
		err = k.create(ctx, c, value)
	} else {
		err = k.add(ctx, sec, c, value)
	}
	if err == nil {
		k.remember(c)
	}
	return err
}

// create makes the Secret with c as its first entry; AlreadyExists when
// another replica got there first.
func (k *KubeLedger) create(ctx context.Context, c Consumption, value []byte) error {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.Timeout)
	defer cancel()
	_, err := k.cfg.Client.CoreV1().Secrets(k.cfg.Namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: k.cfg.Name, Namespace: k.cfg.Namespace, Labels: map[string]string{ledgerManagedLabel: ledgerManagedBy}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{c.Ref: value},
	}, metav1.CreateOptions{})
	return err
}

// add writes sec back with c added, at the resourceVersion it was read
// at: the API server refuses it with Conflict if anyone wrote in between.
func (k *KubeLedger) add(ctx context.Context, sec *corev1.Secret, c Consumption, value []byte) error {
	if raw, ok := sec.Data[c.Ref]; ok {
		k.remember(decodeKubeEntry(c.Ref, raw))
		return k.wrap(fmt.Errorf("reference %s: %w", c.Ref, ErrTokenConsumed))
	}
	size := len(c.Ref) + len(value)
	for key, v := range sec.Data {
		size += len(key) + len(v)
	}
	if size > maxLedgerSecretSize {
		return fmt.Errorf("%d consumed tokens fill the Secret (%d bytes, at most %d); remove the entries of tokens that are gone from the token file or expired", len(sec.Data), size, maxLedgerSecretSize)
	}
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	sec.Data[c.Ref] = value
	if sec.Labels == nil {
		sec.Labels = map[string]string{}
	}
	sec.Labels[ledgerManagedLabel] = ledgerManagedBy
	ctx, cancel := context.WithTimeout(ctx, k.cfg.Timeout)
	defer cancel()
	_, err := k.cfg.Client.CoreV1().Secrets(k.cfg.Namespace).Update(ctx, sec, metav1.UpdateOptions{})
	return err
}
