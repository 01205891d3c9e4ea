// Command celgate evaluates the gate's ValidatingAdmissionPolicy and MutatingAdmissionPolicy
// offline, as kube-apiserver's admission plugins do, with the CEL libraries of the pinned
// Kubernetes release: it compiles each policy the way the plugins' compilePolicy does
// (k8s.io/apiserver/pkg/admission/plugin/policy/{validating,mutating}), evaluates
// matchConditions, variables, validations and messageExpressions over
// object/oldObject/request/params/namespaceObject, and applies the mutations' JSON patches.
//
// Input (stdin, JSON): {"validating": <spec>, "mutating": <spec or null>, "params": <object or
// null>, "paramPolicies": [{"validating": <spec>, "mutating": <spec or null>}], "cases":
// [{"name", "operation", "subResource", "namespace", "object", "oldObject", "userInfo":
// {"username", "groups"}, "lookups": {<paramKind kind>: [<object>, ...]}}]}. Output (stdout,
// JSON): one result per case: the object after the mutating policies ("object"), whether the
// first one's match conditions held ("mutated"), and the first denial of the validating
// policies ("denied", "" when admitted).
//
// "paramPolicies" are evaluated as bindings with a paramRef selector are: once per object of
// their paramKind the case's "lookups" hold, none when it holds none (parameterNotFoundAction
// Allow). Mutating policies run in order, "mutating" first, and all run once more when one
// changed the object (reinvocationPolicy IfNeeded); then the validating ones, "validating"
// first.
//
// What it leaves to the caller: which requests a policy matches (matchConstraints and the
// binding's namespaceSelector), the API server's defaulting, and the parameter lookup
// (params null stands for no parameter object; "lookups" are the objects a selector finds in
// the request's namespace).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
)

type userInfo struct {
	Username string   `json:"username"`
	Groups   []string `json:"groups"`
}

type request struct {
	Name        string                 `json:"name"`
	Operation   string                 `json:"operation"`
	SubResource string                 `json:"subResource"`
	Namespace   string                 `json:"namespace"`
	Object      map[string]interface{} `json:"object"`
	OldObject   map[string]interface{} `json:"oldObject"`
	UserInfo    userInfo               `json:"userInfo"`
	// Mutate: the mutating policy's matchConstraints match the request (the caller decides).
	Mutate bool `json:"mutate"`
	// Lookups: by paramKind kind, the objects a paramRef selector finds for the request.
	Lookups map[string][]map[string]interface{} `json:"lookups"`
}

type policyPair struct {
	Validating admissionregistrationv1.ValidatingAdmissionPolicySpec `json:"validating"`
	Mutating   *admissionregistrationv1.MutatingAdmissionPolicySpec  `json:"mutating"`
}

type input struct {
	Validating    admissionregistrationv1.ValidatingAdmissionPolicySpec `json:"validating"`
	Mutating      *admissionregistrationv1.MutatingAdmissionPolicySpec  `json:"mutating"`
	Params        map[string]interface{}                                `json:"params"`
	ParamPolicies []policyPair                                          `json:"paramPolicies"`
	Cases         []request                                             `json:"cases"`
}

// compiled is a policy pair ready to evaluate, with where its parameters come from.
type compiled struct {
	validator validating.Validator
	mutating  *mutatingPolicy
	// kind: the paramKind whose lookups are the parameters; "" for the one fixed params.
	kind string
}

type result struct {
	Name    string                 `json:"name"`
	Mutated bool                   `json:"mutated"`
	Object  map[string]interface{} `json:"object"`
	Denied  string                 `json:"denied"`
	Error   string                 `json:"error,omitempty"`
}

var (
	podGVK = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	podGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

// baseEnv is the environment both plugins compile stored policies with.
func baseEnv() *environment.EnvSet {
	return environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())
}

// compileValidating mirrors validating.compilePolicy (plugin.go).
func compileValidating(spec *admissionregistrationv1.ValidatingAdmissionPolicySpec) (validating.Validator, error) {
	hasParam := spec.ParamKind != nil
	optionalVars := plugincel.OptionalVariableDeclarations{HasParams: hasParam, HasAuthorizer: true}
	expressionOptionalVars := plugincel.OptionalVariableDeclarations{HasParams: hasParam, HasAuthorizer: false}
	compiler, err := plugincel.NewCompositedCompiler(baseEnv())
	if err != nil {
		return nil, err
	}
	variables := make([]plugincel.NamedExpressionAccessor, len(spec.Variables))
	for i, v := range spec.Variables {
		variables[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	compiler.CompileAndStoreVariables(variables, optionalVars, environment.StoredExpressions)
	var matcher matchconditions.Matcher
	if len(spec.MatchConditions) > 0 {
		accessors := make([]plugincel.ExpressionAccessor, len(spec.MatchConditions))
		for i := range spec.MatchConditions {
			accessors[i] = (*matchconditions.MatchCondition)(&spec.MatchConditions[i])
		}
		matcher = matchconditions.NewMatcher(compiler.CompileCondition(accessors, optionalVars, environment.StoredExpressions), spec.FailurePolicy, "policy", "validate", "celgate")
	}
	validations := make([]plugincel.ExpressionAccessor, len(spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(spec.Validations))
	for i, v := range spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	return validating.NewValidator(
		compiler.CompileCondition(validations, optionalVars, environment.StoredExpressions),
		matcher,
		compiler.CompileCondition(nil, optionalVars, environment.StoredExpressions),
		compiler.CompileCondition(messages, expressionOptionalVars, environment.StoredExpressions),
		spec.FailurePolicy,
		nil,
	), nil
}

type mutatingPolicy struct {
	compiler *plugincel.CompositedCompiler
	matcher  matchconditions.Matcher
	patchers []patch.Patcher
}

// compileMutating mirrors mutating.compilePolicy (compilation.go), JSON patches only.
func compileMutating(spec *admissionregistrationv1.MutatingAdmissionPolicySpec) (*mutatingPolicy, error) {
	opts := plugincel.OptionalVariableDeclarations{HasParams: spec.ParamKind != nil, HasAuthorizer: true}
	compiler, err := plugincel.NewCompositedCompiler(baseEnv())
	if err != nil {
		return nil, err
	}
	variables := make([]plugincel.NamedExpressionAccessor, len(spec.Variables))
	for i, v := range spec.Variables {
		variables[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	compiler.CompileAndStoreVariables(variables, opts, environment.StoredExpressions)
	policy := &mutatingPolicy{compiler: compiler}
	if len(spec.MatchConditions) > 0 {
		accessors := make([]plugincel.ExpressionAccessor, len(spec.MatchConditions))
		for i := range spec.MatchConditions {
			accessors[i] = (*matchconditions.MatchCondition)(&spec.MatchConditions[i])
		}
		policy.matcher = matchconditions.NewMatcher(compiler.CompileCondition(accessors, opts, environment.StoredExpressions), spec.FailurePolicy, "policy", "validate", "celgate")
	}
	patchOptions := opts
	patchOptions.HasPatchTypes = true
	for _, m := range spec.Mutations {
		if m.PatchType != admissionregistrationv1.PatchTypeJSONPatch || m.JSONPatch == nil {
			return nil, fmt.Errorf("only JSONPatch mutations are evaluated, got %q", m.PatchType)
		}
		accessor := &patch.JSONPatchCondition{Expression: m.JSONPatch.Expression}
		evaluator := compiler.CompileMutatingEvaluator(accessor, patchOptions, environment.StoredExpressions)
		if errs := evaluator.CompilationErrors(); len(errs) > 0 {
			return nil, fmt.Errorf("mutation %q: %v", m.JSONPatch.Expression, errs)
		}
		policy.patchers = append(policy.patchers, patch.NewJSONPatcher(evaluator))
	}
	return policy, nil
}

func attributes(r request, object, old runtime.Object) *admission.VersionedAttributes {
	name := ""
	if object != nil {
		name = object.(*unstructured.Unstructured).GetName()
	}
	record := admission.NewAttributesRecord(object, old, podGVK, r.Namespace, name, podGVR, r.SubResource,
		admission.Operation(r.Operation), nil, false, &user.DefaultInfo{Name: r.UserInfo.Username, Groups: r.UserInfo.Groups})
	return &admission.VersionedAttributes{Attributes: record, VersionedKind: podGVK, VersionedObject: admission.NewLazyObject(object), VersionedOldObject: admission.NewLazyObject(old)}
}

// paramsOf are the parameter objects `p` is evaluated with for `r`: the fixed params, or one
// evaluation per looked-up object of its kind (none: not evaluated).
func paramsOf(in *input, p compiled, r request) []runtime.Object {
	if p.kind == "" {
		if in.Params == nil {
			return []runtime.Object{nil}
		}
		return []runtime.Object{&unstructured.Unstructured{Object: in.Params}}
	}
	var params []runtime.Object
	for _, object := range r.Lookups[p.kind] {
		params = append(params, &unstructured.Unstructured{Object: object})
	}
	return params
}

// mutate applies `m` with `params` to attrs' object; whether its match conditions held.
func mutate(ctx context.Context, m *mutatingPolicy, attrs *admission.VersionedAttributes, params runtime.Object, namespace *corev1.Namespace) (bool, error) {
	// As the mutating dispatcher does: a fresh context for the policy's variables.
	ctx = m.compiler.CreateContext(ctx)
	if m.matcher != nil {
		match := m.matcher.Match(ctx, attrs, params, nil)
		if match.Error != nil {
			return false, fmt.Errorf("mutating match conditions: %w", match.Error)
		}
		if !match.Matches {
			return false, nil
		}
	}
	scheme := runtime.NewScheme()
	for _, patcher := range m.patchers {
		patched, err := patcher.Patch(ctx, patch.Request{
			MatchedResource:     podGVR,
			VersionedAttributes: attrs,
			ObjectInterfaces:    admission.NewObjectInterfacesFromScheme(scheme),
			OptionalVariables:   plugincel.OptionalVariableBindings{VersionedParams: params},
			Namespace:           namespace,
		}, celconfig.RuntimeCELCostBudget)
		if err != nil {
			return false, fmt.Errorf("mutation: %w", err)
		}
		attrs.UpdateObject(patched)
	}
	return true, nil
}

func evaluate(ctx context.Context, in *input, policies []compiled, r request) result {
	out := result{Name: r.Name}
	namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.Namespace}}
	object := &unstructured.Unstructured{Object: r.Object}
	var old runtime.Object
	if r.OldObject != nil {
		old = &unstructured.Unstructured{Object: r.OldObject}
	}
	if r.Mutate {
		attrs := attributes(r, object, old)
		// A second round when the first changed the object: IfNeeded reinvocation.
		for round := 0; round < 2; round++ {
			before := attrs.VersionedObject.Object().(*unstructured.Unstructured).DeepCopy()
			for i, p := range policies {
				if p.mutating == nil {
					continue
				}
				for _, params := range paramsOf(in, p, r) {
					matched, err := mutate(ctx, p.mutating, attrs, params, namespace)
					if err != nil {
						out.Error = err.Error()
						return out
					}
					if i == 0 && round == 0 {
						out.Mutated = matched
					}
				}
			}
			after := attrs.VersionedObject.Object().(*unstructured.Unstructured)
			if equality.Semantic.DeepEqual(before.Object, after.Object) {
				break
			}
		}
		object = attrs.VersionedObject.Object().(*unstructured.Unstructured)
	}
	out.Object = object.Object
	attrs := attributes(r, object, old)
	for _, p := range policies {
		for _, params := range paramsOf(in, p, r) {
			validated := p.validator.Validate(ctx, podGVR, attrs, params, namespace, celconfig.RuntimeCELCostBudget, nil)
			for _, decision := range validated.Decisions {
				if decision.Action == validating.ActionDeny {
					out.Denied = decision.Message
					if decision.Evaluation == validating.EvalError {
						out.Error = decision.Message
					}
					return out
				}
			}
		}
	}
	return out
}

func compilePair(v *admissionregistrationv1.ValidatingAdmissionPolicySpec, m *admissionregistrationv1.MutatingAdmissionPolicySpec, kind string) (compiled, error) {
	validator, err := compileValidating(v)
	if err != nil {
		return compiled{}, err
	}
	pair := compiled{validator: validator, kind: kind}
	if m != nil {
		if pair.mutating, err = compileMutating(m); err != nil {
			return compiled{}, err
		}
	}
	return pair, nil
}

func run() error {
	var in input
	decoder := json.NewDecoder(os.Stdin)
	if err := decoder.Decode(&in); err != nil {
		return fmt.Errorf("reading the input: %w", err)
	}
	gate, err := compilePair(&in.Validating, in.Mutating, "")
	if err != nil {
		return err
	}
	policies := []compiled{gate}
	for i := range in.ParamPolicies {
		pair := &in.ParamPolicies[i]
		if pair.Validating.ParamKind == nil || pair.Validating.ParamKind.Kind == "" {
			return fmt.Errorf("paramPolicies[%d]: a validating policy without paramKind", i)
		}
		if pair.Mutating != nil && (pair.Mutating.ParamKind == nil || pair.Mutating.ParamKind.Kind != pair.Validating.ParamKind.Kind) {
			return fmt.Errorf("paramPolicies[%d]: the mutating policy's paramKind is not the validating one's", i)
		}
		p, err := compilePair(&pair.Validating, pair.Mutating, pair.Validating.ParamKind.Kind)
		if err != nil {
			return fmt.Errorf("paramPolicies[%d]: %w", i, err)
		}
		policies = append(policies, p)
	}
	ctx := context.Background()
	results := make([]result, 0, len(in.Cases))
	for _, r := range in.Cases {
		results = append(results, evaluate(ctx, &in, policies, r))
	}
	return json.NewEncoder(os.Stdout).Encode(results)
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "celgate:", err)
		os.Exit(1)
	}
}
