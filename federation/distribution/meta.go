package distribution

import (
	"fmt"
	"maps"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// checkMetadata checks the labels and annotations set on distributed
// objects: valid keys and label values, and never the managed-by label,
// which only the controller sets.
func checkMetadata(labels, annotations map[string]string) error {
	for k, v := range labels {
		if k == ManagedByLabel {
			return fmt.Errorf("label %q is the controller's own: it marks what it may update and delete", k)
		}
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("label key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("label %q value %q: %s", k, v, strings.Join(errs, "; "))
		}
	}
	for k := range annotations {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("annotation key %q: %s", k, strings.Join(errs, "; "))
		}
	}
	return nil
}

// hasAll reports whether have holds every key of want with its value.
func hasAll(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// merged returns a copy of base with extra's entries set over it, never
// nil.
func merged(base, extra map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(extra))
	maps.Copy(out, base)
	maps.Copy(out, extra)
	return out
}
