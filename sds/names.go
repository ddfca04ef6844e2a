package sds

import (
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Limits on what one stream may ask for. Envoy asks for a handful of names
// per stream; the limits bound the work and memory one caller can cause.
const (
	// MaxNames is the most resource names one stream may subscribe to.
	MaxNames = 64
	// MaxNameLen is the longest resource name accepted, in bytes.
	MaxNameLen = 2048
)

// RootCAMode is what the resource ROOTCA holds (Config.RootCA).
type RootCAMode string

const (
	// RootCALocal serves ROOTCA as the local trust domain's roots, a
	// plain trusted_ca, as Istio's own agent does. The zero RootCAMode
	// means it too.
	RootCALocal RootCAMode = "local"
	// RootCASPIFFE serves ROOTCA exactly as ALL, under the name ROOTCA:
	// every trust domain the caller's trust-policy decision allows, as
	// Envoy's SPIFFE certificate validator (or one trusted_ca for nodes
	// that set DisableSPIFFEValidationKey). This is SPIRE's agent with
	// default_all_bundles_name = "ROOTCA", which is how Istio sidecars,
	// asking for ROOTCA only, verify federated peers.
	RootCASPIFFE RootCAMode = "spiffe"
)

// ParseRootCAMode reads a flag value: "local" or "spiffe".
func ParseRootCAMode(s string) (RootCAMode, error) {
	switch m := RootCAMode(s); m {
	case RootCALocal, RootCASPIFFE:
		return m, nil
	}
	return "", fmt.Errorf("sds: unknown ROOTCA mode %q: want %q or %q", s, RootCALocal, RootCASPIFFE)
}

// nameKind says what a resource name asks for.
type nameKind int

const (
	// kindUnknown names nothing this server serves; it is never sent.
	kindUnknown nameKind = iota
	// kindCert is a tls_certificate: "default", or a SPIFFE ID with a
	// path (id), which must be the caller's own.
	kindCert
	// kindTrustDomain is one trust domain's roots (td): ROOTCA and
	// spiffe://<local td> name the local one.
	kindTrustDomain
	// kindAll is every trust domain's roots.
	kindAll
)

// parsedName is a resource name classified by parseName.
type parsedName struct {
	kind nameKind
	id   spiffeid.ID          // kindCert with a SPIFFE ID; zero for "default"
	td   spiffeid.TrustDomain // kindTrustDomain
}

// parseName classifies a resource name. It is pure: whether the caller may
// have a certificate name is decided by the stream, which knows who the
// caller is.
func parseName(name string, local spiffeid.TrustDomain) parsedName {
	switch name {
	case DefaultName:
		return parsedName{kind: kindCert}
	case RootCAName:
		if local.IsZero() {
			return parsedName{}
		}
		return parsedName{kind: kindTrustDomain, td: local}
	case AllName:
		return parsedName{kind: kindAll}
	}
	if !strings.HasPrefix(name, "spiffe://") || len(name) > MaxNameLen {
		return parsedName{}
	}
	id, err := spiffeid.FromString(name)
	if err != nil {
		return parsedName{}
	}
	// Only the canonical spelling names a resource: Envoy matches the
	// secret it gets back by the name it asked for.
	if id.String() != name {
		return parsedName{}
	}
	if id.Path() == "" {
		return parsedName{kind: kindTrustDomain, td: id.TrustDomain()}
	}
	return parsedName{kind: kindCert, id: id}
}

// parse is parseName under the server's ROOTCA mode: in RootCASPIFFE,
// ROOTCA asks for what ALL does, while spiffe://<local td> still names the
// local roots alone.
func (s *Server) parse(name string) parsedName {
	if name == RootCAName && s.cfg.RootCA == RootCASPIFFE {
		return parsedName{kind: kindAll}
	}
	return parseName(name, s.cfg.TrustDomain)
}

// checkNames enforces MaxNames and MaxNameLen on a subscription.
func checkNames(names []string) error {
	if len(names) > MaxNames {
		return fmt.Errorf("%d resource names requested; at most %d are allowed", len(names), MaxNames)
	}
	for i, n := range names {
		if len(n) > MaxNameLen {
			return fmt.Errorf("resource name %d is %d bytes long; at most %d are allowed", i, len(n), MaxNameLen)
		}
	}
	return nil
}
