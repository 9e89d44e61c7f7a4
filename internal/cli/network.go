package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

// newNetworkCmd reads and changes a sandbox's network.
func newNetworkCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "network", Short: "a sandbox's network: its allowlist, refusals and their log"}
	show := func(cmd *cobra.Command, n *api.SandboxNetwork) error {
		if g.json {
			return printJSON(cmd.OutOrStdout(), n)
		}
		w := cmd.OutOrStdout()
		fmt.Fprintf(w, "enabled:  %v\naddress:  %s\ngateway:  %s\negress:   %s\ndenied:   %d\n", n.Enabled,
			orDash(n.Address), orDash(n.Gateway), orDash(strings.Join(n.Egress, " ")), n.Denied)
		return nil
	}
	get := &cobra.Command{
		Use:   "get ID",
		Short: "show a sandbox's address, allowlist and refusal counts",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := g.client().Network(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return show(cmd, n)
		},
	}
	set := &cobra.Command{
		Use:   "set ID [ENTRY...]",
		Short: "replace a running sandbox's allowlist (no entries: nothing reachable)",
		Long: "Entries: CIDR or ADDR[:PORT][/tcp|/udp], HOST[:PORT][/tcp|/udp] (a name or *.suffix),\n" +
			"a network rule's name (warren network-rules ls) or internet.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := g.client().SetNetwork(cmd.Context(), args[0], args[1:])
			if err != nil {
				return err
			}
			return show(cmd, n)
		},
	}
	denials := &cobra.Command{
		Use:   "denials ID",
		Short: "the log of what a sandbox's network refused, oldest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := g.client().NetworkDenials(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), d)
			}
			tb := newTable(cmd.OutOrStdout(), "TIME", "STEP", "PROTO", "DESTINATION", "REASON", "COUNT")
			for _, r := range d.Denials {
				step := "-"
				if r.Step > 0 {
					step = strconv.FormatInt(r.Step, 10)
				}
				tb.row(r.Time.Local().Format(time.TimeOnly), step, r.Protocol, r.Destination, r.Reason, strconv.FormatInt(r.Count, 10))
			}
			return tb.flush()
		},
	}
	cmd.AddCommand(get, set, denials)
	return cmd
}

// newNetworkRulesCmd manages the cluster's named network rules.
func newNetworkRulesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "network-rules", Aliases: []string{"network-rule"}, Short: "named network rules (\"pypi\"): root admins write, everyone reads"}
	put, ls := newNetworkRulePutCmd(g), newNetworkRulesLsCmd(g)
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "show one rule",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := g.client().NetworkRule(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), r)
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "delete rules",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, n := range args {
				if _, err := g.client().DeleteNetworkRule(cmd.Context(), n); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(put, ls, get, rm)
	return cmd
}

// newNetworkRulePutCmd is `warren network-rules put`: it creates or
// replaces a rule and prints its name and version.
func newNetworkRulePutCmd(g *globals) *cobra.Command {
	var (
		rule  api.NetworkRule
		ports []string
	)
	cmd := &cobra.Command{
		Use:   "put NAME (--host H | --cidr C)... [--port P]... [--proto tcp|udp]",
		Short: "create or replace a rule; running sandboxes that name it follow within a second",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rule.Name = args[0]
			rule.Ports = nil
			for _, p := range ports {
				n, err := strconv.Atoi(p)
				if err != nil {
					return fmt.Errorf("--port %q: not a number", p)
				}
				rule.Ports = append(rule.Ports, n)
			}
			out, err := g.client().PutNetworkRule(cmd.Context(), rule)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s version %d\n", out.Name, out.Version)
			return err
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&rule.Hosts, "host", nil, "a DNS name or *.suffix (repeatable)")
	f.StringArrayVar(&rule.CIDRs, "cidr", nil, "an IPv4 CIDR or address (repeatable)")
	f.StringArrayVar(&ports, "port", nil, "a port, 1-65535 (repeatable; none: every port)")
	f.StringArrayVar(&rule.Protocols, "proto", nil, "tcp or udp (repeatable; none: both)")
	return cmd
}

// newNetworkRulesLsCmd is `warren network-rules ls`: it lists the rules.
func newNetworkRulesLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "list the rules",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rs, err := g.client().NetworkRules(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), api.NetworkRuleList{Rules: rs})
			}
			tb := newTable(cmd.OutOrStdout(), "NAME", "VERSION", "HOSTS", "CIDRS", "PORTS", "PROTOCOLS")
			for _, r := range rs {
				var ps []string
				for _, p := range r.Ports {
					ps = append(ps, strconv.Itoa(p))
				}
				tb.row(r.Name, strconv.FormatUint(r.Version, 10), orDash(strings.Join(r.Hosts, ",")), orDash(strings.Join(r.CIDRs, ",")),
					orDash(strings.Join(ps, ",")), orDash(strings.Join(r.Protocols, ",")))
			}
			return tb.flush()
		},
	}
}
