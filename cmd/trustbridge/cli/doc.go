// Package cli is what trustbridge's command groups share: the process's
// streams and clock (Env), the -o/--output flag and its formats, the
// connection to a server's admin API (AdminClient) and to its certificate
// service (CAConn), exit codes beyond 1 (ExitError) and the small file
// helpers. Each command group is a package beneath it (cli/federation,
// cli/bundle, cli/ca, ...) whose NewCmd returns its cobra command;
// cmd/trustbridge adds them to the root.
//
//	func NewCmd(e cli.Env) *cobra.Command {
//		var output *cli.OutputFlag
//		cmd := &cobra.Command{Use: "status", RunE: func(cmd *cobra.Command, _ []string) error {
//			t := cli.Table{Columns: []cli.Column{{Name: "Trust domain"}, {Name: "Endpoint", Priority: 1}}}
//			for _, p := range peers {
//				t.Rows = append(t.Rows, cli.Row{Name: p.TrustDomain, Cells: []any{p.TrustDomain, p.URL}})
//			}
//			return output.Print(e.Out, peers, t) // table, wide, name, json, yaml, jsonpath=
//		}}
//		output = cli.AddOutputFlag(cmd)
//		return cmd
//	}
//
// A command with a table written by hand calls output.Write(e.Out, v,
// func(io.Writer) error) instead: it has no wide columns, names or
// --no-headers.
package cli
