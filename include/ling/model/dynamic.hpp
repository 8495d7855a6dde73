#pragma once
// The dynamic model: every dimension read from config.json, so any checkpoint of the family loads
// (Ling and Kimi-Linear alike; family switches come from the config too).
#include "ling/model/hybrid_model.hpp"
#include "ling/model/spec.hpp"

namespace ling::model {

template <class Policies = quant::DefaultPolicies>
using DynamicModel = HybridModel<DynamicSpec, Policies>;

}  // namespace ling::model
