package server

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// registerBuildInfo registers trustbridge_build_info, 1 labelled with the
// version and the Go version: what `trustbridge version` prints, for
// dashboards and alerts that join on it.
func registerBuildInfo(reg prometheus.Registerer, version string) {
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "trustbridge_build_info",
		Help: "Always 1; labelled with the trustbridge version and the Go version it was built with.",
	}, []string{"version", "goversion"})
	info.WithLabelValues(version, runtime.Version()).Set(1)
	reg.MustRegister(info)
}
