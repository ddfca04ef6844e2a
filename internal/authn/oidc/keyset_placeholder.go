package oidc

// PLACEHOLDER, DELETE AT MERGE: compile-only stand-ins for the key set that
// the "oidckeys" branch adds in keyset.go (same package). They exist only so
// this branch builds and its unit tests (which inject fake key sources) run
// before that branch is merged. Nothing here fetches anything; no test
// expectation depends on it. The lead deletes this file when merging
// oidckeys.

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net/http"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

var (
	ErrUnknownKey      = errors.New("placeholder: unknown key")
	ErrKeysUnavailable = errors.New("placeholder: keys unavailable")
)

type keySetConfig struct {
	name, issuer    string
	roots           *x509.CertPool
	allowPrivate    bool
	refreshInterval time.Duration
	maxKeyAge       time.Duration
	clock           clock.PassiveClock
	logger          *slog.Logger
	metrics         *keyMetrics
	client          *http.Client
}

type keySet struct{}

type keySetStatus struct {
	Keys                               int
	LastFetch, LastSuccess, FreshUntil time.Time
	LastError                          string
}

type keyMetrics struct{}

func newKeyMetrics(prometheus.Registerer) (*keyMetrics, error) { return &keyMetrics{}, nil }

func newKeySet(keySetConfig) (*keySet, error) {
	return nil, errors.New("placeholder: the oidckeys branch is not merged")
}

func (k *keySet) Keys(context.Context, string) ([]jose.JSONWebKey, error) {
	return nil, ErrKeysUnavailable
}

func (k *keySet) Status() keySetStatus { return keySetStatus{} }
