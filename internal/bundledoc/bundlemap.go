package bundledoc

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// ParseMap parses a SPIFFE bundle map ({"trust_domains": {"td": bundle}}),
// returning the bundles sorted by trust domain. Each bundle is parsed as
// Parse does, except that refresh hints are ignored (the spec forbids
// consumers to use them). Duplicate trust domains are an error.
func ParseMap(doc []byte) ([]*spiffebundle.Bundle, []Warning, error) {
	if err := checkStrict(doc); err != nil {
		return nil, nil, wrap(err)
	}
	top, err := decodeObject(doc, "bundle map")
	if err != nil {
		return nil, nil, wrap(err)
	}
	if err := checkMemberNames(top, "trust_domains", "keys"); err != nil {
		return nil, nil, wrap(err)
	}
	raw, ok := top["trust_domains"]
	if !ok {
		if _, isBundle := top["keys"]; isBundle {
			return nil, nil, wrap(errors.New(`missing "trust_domains" (this is a SPIFFE bundle, not a bundle map)`))
		}
		return nil, nil, wrap(errors.New(`missing "trust_domains"`))
	}
	// checkStrict has already refused duplicate member names, so a trust
	// domain cannot appear twice by the time it is a Go map key.
	entries, err := decodeObject(raw, `"trust_domains"`)
	if err != nil {
		return nil, nil, wrap(err)
	}
	names := make([]string, 0, len(entries))
	for name := range entries {
		names = append(names, name)
	}
	sort.Strings(names)

	var (
		bundles  []*spiffebundle.Bundle
		warnings []Warning
	)
	for _, name := range names {
		td, err := TrustDomainName(name)
		if err != nil {
			return nil, nil, wrap(&EntryError{TrustDomain: name, Err: fmt.Errorf("invalid trust domain: %w", err)})
		}
		members, err := decodeObject(entries[name], "bundle")
		if err != nil {
			return nil, nil, wrap(&EntryError{TrustDomain: name, Err: err})
		}
		b, warns, err := parseBundle(td, members, true)
		if err != nil {
			return nil, nil, wrap(&EntryError{TrustDomain: name, Err: err})
		}
		for _, w := range warns {
			w.TrustDomain = name
			warnings = append(warnings, w)
		}
		bundles = append(bundles, b)
	}
	return bundles, warnings, nil
}

// ReadMap is ParseMap over a reader, with the same size cap as Read.
func ReadMap(r io.Reader, limit int64) ([]*spiffebundle.Bundle, []Warning, error) {
	doc, err := ReadLimited(r, limit)
	if err != nil {
		return nil, nil, err
	}
	return ParseMap(doc)
}

// TrustDomainName parses a bare trust domain name. go-spiffe also accepts
// "spiffe://td/any/path" and silently keeps the trust domain; where a
// document or config names a trust domain, anything but the bare name is a
// mistake worth refusing. Errors do not repeat the input; callers name it.
func TrustDomainName(name string) (spiffeid.TrustDomain, error) {
	if name == "" {
		return spiffeid.TrustDomain{}, errors.New("is empty")
	}
	if strings.ContainsAny(name, ":/") {
		return spiffeid.TrustDomain{}, errors.New("must be a bare trust-domain name such as example.org, without scheme, port or path")
	}
	// go-spiffe accepts ".", "a..b" and "example.org." (which would then
	// count as a different trust domain from "example.org"); SPIFFE ID
	// §2.1 asks for DNS-like names of at most 255 bytes.
	if len(name) > 255 {
		return spiffeid.TrustDomain{}, fmt.Errorf("is %d bytes long; at most 255 are allowed", len(name))
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" {
			return spiffeid.TrustDomain{}, errors.New("has an empty label (leading, trailing or doubled dot)")
		}
	}
	td, err := spiffeid.TrustDomainFromString(name)
	if err != nil {
		return spiffeid.TrustDomain{}, err
	}
	return td, nil
}

// ParseTrustDomain parses a trust domain as an operator writes it on a
// command line or in an admin request: the bare name (example.org) or the
// trust domain's SPIFFE ID (spiffe://example.org), as SPIRE's CLI takes
// both. The name obeys TrustDomainName; a SPIFFE ID with a path names a
// workload, not a trust domain, and is refused rather than cut. Errors do
// not repeat the input; callers name it.
func ParseTrustDomain(s string) (spiffeid.TrustDomain, error) {
	name, isID := strings.CutPrefix(s, "spiffe://")
	if isID && strings.ContainsAny(name, "/?#") {
		return spiffeid.TrustDomain{}, errors.New("is a SPIFFE ID with a path; a trust domain is written example.org or spiffe://example.org")
	}
	if !isID && strings.ContainsAny(s, ":/") {
		return spiffeid.TrustDomain{}, errors.New("must be a trust domain such as example.org or spiffe://example.org, without another scheme, port or path")
	}
	return TrustDomainName(name)
}

// IsMap reports whether doc looks like a bundle map rather than a bundle: a
// JSON object with "trust_domains" and no "keys". It validates nothing;
// parse with ParseMap or Parse accordingly.
func IsMap(doc []byte) bool {
	var top map[string]json.RawMessage
	if json.Unmarshal(doc, &top) != nil {
		return false
	}
	_, hasMap := top["trust_domains"]
	_, hasKeys := top["keys"]
	return hasMap && !hasKeys
}
