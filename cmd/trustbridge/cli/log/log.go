package log

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// NewCmd is trustbridge log.
func NewCmd(e cli.Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "log",
		Short:   "The running server's logs",
		Example: `  trustbridge log level debug`,
	}
	cmd.AddCommand(newLevelCmd(e))
	return cmd
}

func newLevelCmd(e cli.Env) *cobra.Command {
	var c cli.AdminClient
	cmd := &cobra.Command{
		Use:   "level [debug|info|warn|error]",
		Short: "Show the running server's log level, or change it until the next restart",
		Long: `Without an argument, print the running server's log level. With one, set it:
at once, for this server (each replica of a Kubernetes deployment has its
own), until the next restart, which applies --log-level again. A change is
recorded in the audit log (log_level_changed, with who made it) and needs the
admin token, or the admin socket, which trustbridge finds in --data-dir.`,
		Example: `  trustbridge log level
  trustbridge log level debug
  trustbridge log level info --admin http://127.0.0.1:15014 --data-dir /var/lib/trustbridge/data`,
		Args:      cobra.MaximumNArgs(1),
		ValidArgs: []string{"debug", "info", "warn", "error"},
		RunE: func(cmd *cobra.Command, args []string) error {
			client := cli.AdminFrom(cmd, &c)
			if len(args) == 0 {
				body, err := client.Do(cmd.Context(), http.MethodGet, "/v1/log/level", nil, false)
				if err != nil {
					return err
				}
				got, err := decode(body)
				if err != nil {
					return err
				}
				fmt.Fprintln(e.Out, got.Level)
				return nil
			}
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(args[0])); err != nil {
				return fmt.Errorf("log level %q: want debug, info, warn or error", args[0])
			}
			req, err := json.Marshal(api.LogLevel{Level: args[0]})
			if err != nil {
				return err
			}
			body, err := client.Do(cmd.Context(), http.MethodPut, "/v1/log/level", req, true)
			if err != nil {
				return err
			}
			got, err := decode(body)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.Out, "log level %s (was %s)\n", got.Level, got.Previous)
			return nil
		},
	}
	f := cmd.Flags()
	f.String("admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	c.AddAuthFlags(f)
	return cmd
}

func decode(body string) (api.LogLevel, error) {
	var l api.LogLevel
	if err := json.Unmarshal([]byte(body), &l); err != nil || l.Level == "" {
		return l, fmt.Errorf("admin answer is not a log level: %q", body)
	}
	return l, nil
}
