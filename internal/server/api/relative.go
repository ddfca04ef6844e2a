package api

import (
	"time"

	"k8s.io/apimachinery/pkg/util/duration"
)

// Relative writes d, a moment's distance from now, as the CLI and /ui
// show it: "5m ago", "in 3d", "now". The amount is kubectl's
// (apimachinery's HumanDuration: "90s", "3h12m", "26h", "400d", "3y"),
// so an operator reads the same ages here as in kubectl get.
func Relative(d time.Duration) string {
	switch {
	case d > -time.Second && d < time.Second:
		return "now"
	case d > 0:
		return "in " + duration.HumanDuration(d)
	default:
		return duration.HumanDuration(-d) + " ago"
	}
}
