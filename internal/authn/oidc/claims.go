package oidc

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// lookup resolves a dotted path through nested JSON objects, where a key
// may itself contain dots ("kubernetes.io.namespace" is
// claims["kubernetes.io"]["namespace"]): at each level the longest key
// that is a prefix of the path is tried first, and a shorter one only
// when the longer leads nowhere. The issuer, not the caller, chose the
// claims, so the order only has to be deterministic.
func lookup(obj map[string]any, path string) (any, bool) {
	if v, ok := obj[path]; ok {
		return v, true
	}
	for i := strings.LastIndexByte(path, '.'); i > 0; i = strings.LastIndexByte(path[:i], '.') {
		sub, ok := obj[path[:i]].(map[string]any)
		if !ok {
			continue
		}
		if v, ok := lookup(sub, path[i+1:]); ok {
			return v, true
		}
	}
	return nil, false
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
		v, ok := lookup(claims, r.Claim)
		if !ok {
			return fmt.Errorf("claim rule: claim %q is missing", r.Claim)
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
