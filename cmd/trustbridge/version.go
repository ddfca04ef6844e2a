package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

// versionInfo is what `trustbridge version -o json|yaml` prints, the
// fields kubectl and istioctl give: enough to tell which build a bug
// report is about.
type versionInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
}

func buildInfo() versionInfo {
	v := version
	if v == "" {
		v = "dev"
		if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
	}
	return versionInfo{Version: v, GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
}

func (v versionInfo) String() string {
	return fmt.Sprintf("trustbridge %s (%s, %s/%s)", v.Version, v.GoVersion, v.OS, v.Arch)
}

func versionString() string { return buildInfo().String() }

// buildVersion is trustbridge's version: set at build time, else the
// module's, else "dev".
func buildVersion() string { return buildInfo().Version }

func newVersionCmd() *cobra.Command {
	var output *cli.OutputFlag
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the trustbridge version",
		Example: `  trustbridge version
  trustbridge version -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := buildInfo()
			return output.Write(cmd.OutOrStdout(), v, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, v)
				return err
			})
		},
	}
	output = cli.AddOutputFlag(cmd)
	return cmd
}
