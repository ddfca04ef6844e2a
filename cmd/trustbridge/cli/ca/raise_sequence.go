package ca

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
)

func newCARaiseSequenceCmd(e cli.Env) *cobra.Command {
	var (
		dataDir string
		above   uint64
	)
	cmd := &cobra.Command{
		Use:   "raise-sequence --data-dir DIR --above N",
		Short: "Move the published spiffe_sequence past N, for peers that hold N or more",
		Long: `Raise the spiffe_sequence of the CA state in --data-dir to N+1; it never
lowers it. Peers refuse a bundle whose sequence is below the one they hold
(sequence_regression), and one with the same sequence but other keys
(sequence_conflict). trustbridge keeps every sequence above the Unix time
and above any it published before, so this is needed only when peers hold a
sequence from a clock that once ran ahead, or one that was never ours. Take
N from the peer (trustbridge federation status, or the metric
trustbridge_federation_bundle_sequence on a trustbridge peer): the highest
it holds. A running server publishes the raised sequence at its next check
(within 30s); a server started later publishes one more.`,
		Example: `  # a peer's federation status shows our sequence 2208988800 (a clock that ran ahead)
  trustbridge ca raise-sequence --data-dir /var/lib/trustbridge --above 2208988800`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if above == 0 {
				return errors.New("--above is required: the highest sequence a peer holds")
			}
			seq, err := ca.RaiseSequence(dataDir, above)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.Out, "the CA state in %s holds sequence %d\n", dataDir, seq)
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "./data", "the server's --data-dir (file storage only)")
	cmd.Flags().Uint64Var(&above, "above", 0, "the highest sequence a peer holds; the state goes to one more")
	return cmd
}
