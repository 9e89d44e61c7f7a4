package apiserver

import (
	"encoding/json"

	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"net/http"
	"sort"
	"time"

	"github.com/warrenhq/warren/api"
)

// Network rules are cluster objects (bus.BucketNetworkRules): admins
// write them, every project reads them, and each edge watches them and
// applies a change to its running sandboxes that name the rule.

func (s *Server) putNetworkRule(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	if !p.Admin() {
		return &api.Error{Code: api.CodeForbidden, Message: "network rules are changed by admins only (a root-project admin token)"}
	}
	var nr api.NetworkRule
	if err := decodeJSON(w, r, &nr); err != nil {
		return err
	}
	nr.Name = r.PathValue("name")
	if err := nr.CheckRule(); err != nil {
		return &api.Error{Code: api.CodeInvalid, Message: err.Error()}
	}
	var old api.NetworkRule
	found, rev, err := s.netRules.Get(r.Context(), nr.Name, &old)
	if err != nil {
		return err
	}
	nr.Version, nr.UpdatedAt, nr.UpdatedBy = old.Version+1, time.Now().UTC(), p.Name
	if found {
		err = s.netRules.Update(r.Context(), nr.Name, &nr, rev)
	} else {
		err = s.netRules.Create(r.Context(), nr.Name, &nr)
	}
	if err != nil {
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("network rule %s changed meanwhile: try again (%v)", nr.Name, err)}
	}
	status := http.StatusOK
	if !found {
		status = http.StatusCreated
	}
	writeJSON(w, status, &nr)
	return nil
}

func (s *Server) getNetworkRule(w http.ResponseWriter, r *http.Request) error {
	var nr api.NetworkRule
	found, _, err := s.netRules.Get(r.Context(), r.PathValue("name"), &nr)
	if err != nil {
		return err
	}
	if !found {
		return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("network rule %q not found", truncate(r.PathValue("name")))}
	}
	writeJSON(w, http.StatusOK, &nr)
	return nil
}

func (s *Server) deleteNetworkRule(w http.ResponseWriter, r *http.Request) error {
	if !principal(r).Admin() {
		return &api.Error{Code: api.CodeForbidden, Message: "network rules are changed by admins only (a root-project admin token)"}
	}
	var nr api.NetworkRule
	found, _, err := s.netRules.Get(r.Context(), r.PathValue("name"), &nr)
	if err != nil {
		return err
	}
	if !found {
		return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("network rule %q not found", truncate(r.PathValue("name")))}
	}
	if err := s.netRules.Delete(r.Context(), nr.Name); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &nr)
	return nil
}

func (s *Server) listNetworkRules(w http.ResponseWriter, r *http.Request) error {
	out := api.NetworkRuleList{Rules: []api.NetworkRule{}}
	err := s.netRules.Each(r.Context(), func(_ string, raw []byte) error {
		var nr api.NetworkRule
		if json.Unmarshal(raw, &nr) == nil {
			out.Rules = append(out.Rules, nr)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Slice(out.Rules, func(i, j int) bool { return out.Rules[i].Name < out.Rules[j].Name })
	writeJSON(w, http.StatusOK, &out)
	return nil
}

// deniedCollector exports warren_network_denied_total{node,reason} from
// the nodes' heartbeats.
type deniedCollector struct{ s *Server }

var deniedDesc = prometheus.NewDesc("warren_network_denied_total",
	"What sandboxes' networks refused (names and packets), by node and reason, since each node started.",
	[]string{"node", "reason"}, nil)

func (c deniedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- deniedDesc }

func (c deniedCollector) Collect(ch chan<- prometheus.Metric) {
	if c.s.cfg.Watcher == nil {
		return
	}
	for _, n := range c.s.cfg.Watcher.Nodes() {
		for reason, v := range n.NetworkDenied {
			ch <- prometheus.MustNewConstMetric(deniedDesc, prometheus.CounterValue, float64(v), n.Name, reason)
		}
	}
}
