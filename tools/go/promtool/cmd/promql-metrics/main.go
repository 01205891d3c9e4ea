// Command promql-metrics parses PromQL expressions with Prometheus' own parser
// (the one promtool and the Prometheus server use) and reports, for each one, the
// parse error or the metric names it selects. The tests use it to check that every
// expression in the GPU dashboard parses and names only metrics that exist.
//
// Input on stdin: a JSON array of expressions. Output on stdout: a JSON array of
// {"expr": ..., "error": "" | message, "metrics": [sorted unique names]}.
// Exit status 0 even when an expression fails to parse; the caller decides.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type result struct {
	Expr    string   `json:"expr"`
	Error   string   `json:"error"`
	Metrics []string `json:"metrics"`
}

func metrics(expr parser.Expr) []string {
	seen := map[string]bool{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		if vs.Name != "" {
			seen[vs.Name] = true
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				seen[m.Value] = true
			}
		}
		return nil
	})
	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func main() {
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Fprintln(os.Stderr, "promql-metrics: stdin must be a JSON array of strings:", err)
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	results := make([]result, 0, len(exprs))
	for _, text := range exprs {
		r := result{Expr: text, Metrics: []string{}}
		expr, err := p.ParseExpr(text)
		if err != nil {
			r.Error = err.Error()
		} else {
			r.Metrics = metrics(expr)
		}
		results = append(results, r)
	}
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, "promql-metrics:", err)
		os.Exit(1)
	}
}
