"""Names vulture (dead-code check in .ci/run) may not see used: public API users call,
PyTorch-compatible parameters kept for signature compatibility, pydantic fields read by
the loader through the model, dataclass counters read by users."""

# ruff: noqa
# mypy: ignore-errors
_ = object()

# public API (PyTorch DeviceMesh / DTensorSpec / Placement compatible)
_.get_local_rank
_.get_all_groups
_._is_current_rank_part_of_mesh  # PyTorch DeviceMesh method name
_.is_shard
_.is_replicate
_.is_partial
_.is_replicated
_.global_offset
_.max_local_numel
_.is_evenly_sharded
_.to_alias
_.device_matrix
_.decide
_.step_cost
_.collectives
async_op  # DTensor.redistribute(async_op=): accepted for PyTorch compatibility
_.async_collectives  # Comm capability: FSDP prefetches with async flat collectives where True

# pydantic: model configuration and fields read through the model
_.model_config
_.doc
_.dist_op_name
_.infer_layout_suffix
_.template_name
_._one_or_list
_._class_form
_._one_kind

# RNG tracker counters (hyper_shard.random.RNGStats), read by users and tests
_.draws
_.elements

# set on DTensors for torch.nn.Parameter bookkeeping
_._is_param

# hyper_shard.fsdp: FSDP2's FSDPModule methods (users call them), the class swap
# (module.__class__ = FSDP<Class>), layout queries the FSDP tests check the byte layout with
_.set_requires_gradient_sync
_.set_requires_all_reduce
_.set_reshard_after_forward
_.set_reshard_after_backward
_.set_is_last_backward
_.set_modules_to_forward_prefetch
_.set_modules_to_backward_prefetch
_.__class__
_.row_start
_.flat_index

# hyper_shard.checkpoint: torch.distributed.checkpoint calls these (StorageWriter,
# StorageReader, AsyncStager interfaces); the index fields are read by users; the module
# __getattr__ serves the torch-only names lazily
__getattr__
_.dim_names
_.world_size
_.should_synchronize_after_execute
_.stage
_.synchronize_staging
_.set_up_storage_writer
_.set_up_storage_reader
_.prepare_local_plan
_.prepare_global_plan
_.write_data
_.finish
_.storage_meta
_.read_metadata
_.read_data

_.as_dict  # flight Record.as_dict(): for users' logs (hyper_shard.debug.recent_ops)

# _register_sharding.unregister: drops a register_sharding strategy (tests restore the registry)
_.unregister

# debug.CommDebugMode: PyTorch's interface, read by users and tests
_.get_comm_counts
_.get_total_counts

# fsdp FSDPModule: FSDP2's public methods, called by users and tests/dist/test_fsdp_api.py
_.set_reduce_scatter_divide_factor
_.set_force_sum_reduction_for_comms
_.set_all_reduce_hook
_.set_reduce_scatter_unused_params
_.set_unshard_in_backward
_.set_reduce_scatter_max_input_buffers
_.set_post_optim_event
_.set_allocate_memory_from_process_group_for_comm
_.set_symm_mem_for_comm
_.set_separate_reduce_scatter_group
_.set_custom_all_gather
_.set_custom_reduce_scatter
_.check_custom_op_aliasing  # torch._functorch.config, set by platform/torch/compiled.py
