package oidc

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// errClaimMissing and errClaimAmbiguous are lookup's failures.
var (
	errClaimMissing   = errors.New("is missing")
	errClaimAmbiguous = errors.New("is ambiguous: the token holds more than one value at that dotted path " +
		`(say a key "a.b" and a key "b" inside "a"), so it is refused rather than guessed`)
)

// lookup resolves a dotted path through nested JSON objects, where a key
// may itself contain dots ("kubernetes.io.namespace" is
// claims["kubernetes.io"]["namespace"], or claims["kubernetes.io.namespace"],
// or claims["kubernetes"]["io"]["namespace"]). Every way of splitting the
// path is tried: a path with more than one resolution is
// errClaimAmbiguous, never settled by a preference, so that everything
// reading a claim (rules, the template, the Kubernetes identity) reads the
// same value or refuses. Each split that gets anywhere descends into a
// different object of the decoded token (a tree), so the work is bounded
// by the token's size.
func lookup(obj map[string]any, path string) (any, error) {
	found := resolve(obj, path, nil)
	switch {
	case len(found) > 1:
		return nil, errClaimAmbiguous
	case len(found) == 0:
		return nil, errClaimMissing
	}
	return found[0], nil
}

// resolve appends the values at path in obj to found, stopping at a
// second one.
func resolve(obj map[string]any, path string, found []any) []any {
	if v, ok := obj[path]; ok {
		found = append(found, v)
	}
	for i := 0; len(found) < 2; {
		j := strings.IndexByte(path[i:], '.')
		if j < 0 {
			break
		}
		i += j
		if sub, ok := obj[path[:i]].(map[string]any); ok {
			found = resolve(sub, path[i+1:], found)
		}
		i++
	}
	return found
}

// claimText is a scalar claim as a rule compares it: a string as is, a
// number by its JSON text, a boolean as "true" or "false". Objects,
// arrays and null never match a rule.
func claimText(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case json.Number:
		return v.String(), true
	case bool:
		return strconv.FormatBool(v), true
	}
	return "", false
}

// checkRulesHold returns an error saying which rule does not hold for
// claims; all must hold.
func checkRulesHold(rules []ClaimRule, claims map[string]any) error {
	for _, r := range rules {
		v, err := lookup(claims, r.Claim)
		if err != nil {
			return fmt.Errorf("claim rule: claim %q %w", r.Claim, err)
		}
		s, ok := claimText(v)
		if !ok {
			return fmt.Errorf("claim rule: claim %q is %s, not a string, number or boolean", r.Claim, jsonKind(v))
		}
		if !slices.Contains(r.Values, s) {
			return fmt.Errorf("claim rule: claim %q is %q, not one of the %d allowed values", r.Claim, truncate(s, 64), len(r.Values))
		}
	}
	return nil
}
